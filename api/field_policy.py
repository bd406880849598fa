"""What the generating endpoints do with each request field they may be sent.

Every field that OpenAI's schema or vLLM's documented extensions define for
/v1/completions or /v1/chat/completions, every field of OpenAI's /v1/responses, and
every field of Anthropic's Messages API for /v1/messages and /v1/messages/count_tokens,
is in one table per endpoint, with one of three
statuses: implemented, accepted with no effect (and why), or refused (a 400 naming the
field, unless its value asks for nothing: null, false, empty, or the one value that is
this server's behaviour anyway). A field no API defines is a 400 naming it, as OpenAI's and
Anthropic's APIs answer; with --accept-unknown-fields it is accepted, as vLLM does, and
named once per field name in a warning in the server log.

`check_fields` applies the table to a request body; `render_markdown` writes it out for the
API docs.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from api.errors import APIError

log = logging.getLogger("nano_vllm.api")

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"
EMBEDDINGS = "/v1/embeddings"
RERANK = "/v1/rerank"
SCORE = "/v1/score"


class Status(StrEnum):
    IMPLEMENTED = "implemented"
    NO_EFFECT = "accepted, no effect"
    REFUSED = "refused (400)"


class Origin(StrEnum):
    OPENAI = "OpenAI"
    VLLM = "vLLM"
    ANTHROPIC = "Anthropic"
    OURS = "nano-vLLM"


# Values that ask for nothing, by default: a refused field sent with one is let through.
EMPTY_VALUES: tuple[Any, ...] = (None, False, "", [], {})


@dataclass(frozen=True)
class FieldRule:
    status: Status
    origin: Origin
    reason: str = ""  # what it does, or why it has no effect or is refused
    # The values that ask for nothing, besides null: this server's behaviour anyway. When
    # none are given, EMPTY_VALUES.
    inert: tuple[Any, ...] = ()
    code: str | None = None  # the refusal's error code, where a client acts on it

    def asks_for(self, value: Any) -> bool:
        """Whether `value` asks for something."""
        inert = (None, *self.inert) if self.inert else EMPTY_VALUES
        return not any(value == v and type(value) is type(v) for v in inert)


def done(reason: str, origin: Origin = Origin.OPENAI) -> FieldRule:
    return FieldRule(Status.IMPLEMENTED, origin, reason)


def no_effect(reason: str, origin: Origin = Origin.OPENAI) -> FieldRule:
    return FieldRule(Status.NO_EFFECT, origin, reason)


def refused(reason: str, origin: Origin = Origin.OPENAI, *inert: Any) -> FieldRule:
    return FieldRule(Status.REFUSED, origin, reason, inert)


V, OURS = Origin.VLLM, Origin.OURS

# Fields both endpoints read the same way.
SHARED: dict[str, FieldRule] = {
    "model": done("The served model's name, or \"default\"; any other is a 404."),
    "stream": done("Server-sent events, one per token and choice."),
    "stream_options": done("include_usage; vLLM's continuous_usage_stats too."),
    "max_tokens": done("Output tokens at most; default: as many as fit."),
    "temperature": done("0 is greedy."),
    "top_p": done("Nucleus sampling."),
    "seed": done("Per-request generator: same seed, same answer."),
    "stop": done("Stop strings, left out of the answer."),
    "n": done("Choices per prompt, at most the server's seats."),
    "presence_penalty": done("Logits processor, -2 to 2."),
    "frequency_penalty": done("Logits processor, -2 to 2."),
    "logit_bias": done("Token id -> bias, -100 to 100."),
    "user": no_effect("An end-user id for the provider's abuse monitoring; not used here."),
    "best_of": done("Samples run per prompt; the n of highest cumulative logprob are returned.",
                    V),
    "response_format": done("json_object or json_schema, through llguidance (on completions "
                            "an extension)."),
    "top_k": done("Top-k sampling; 0 or -1 is off.", V),
    "min_p": done("Min-p sampling.", V),
    "repetition_penalty": done("Logits processor; 1 is off.", V),
    "stop_token_ids": done("Token ids that end the answer.", V),
    "ignore_eos": done("Keep generating past the end-of-sequence token.", V),
    "min_tokens": done("End-of-sequence and stop tokens do not end the answer before this "
                       "many.", V),
    "allowed_token_ids": done("Only these tokens may be sampled.", V),
    "priority": done("Lower is seated first; needs --scheduling-policy priority.", V),
    "structured_outputs": done("json, regex, choice or json_object, through llguidance.", V),
    "guided_json": done("vLLM's older spelling of structured_outputs.json.", V),
    "guided_regex": done("vLLM's older spelling of structured_outputs.regex.", V),
    "guided_choice": done("vLLM's older spelling of structured_outputs.choice.", V),
    "guided_grammar": refused("Grammars other than JSON schema, regex and choice are not "
                              "offered.", V),
    "guided_decoding_backend": no_effect("There is one backend, llguidance.", V),
    "guided_whitespace_pattern": refused("JSON is always generated without optional "
                                         "whitespace.", V),
    "bad_words": refused("Not offered; logit_bias with -100 bans tokens.", V),
    "use_beam_search": refused("Beam search is not offered.", V),
    "length_penalty": refused("Applies to beam search only, which is not offered.", V, 1, 1.0),
    "include_stop_str_in_output": refused("Stop strings are always left out of the answer.",
                                          V),
    "skip_special_tokens": refused("Special tokens are always left out of the text.", V,
                                   True),
    "spaces_between_special_tokens": no_effect("Special tokens are left out of the text, so "
                                               "there is nothing to space.", V),
    "truncate_prompt_tokens": refused("Prompts are never truncated; a prompt too long is a "
                                      "400.", V),
    "prompt_logprobs": refused("Not offered as a field; on /v1/completions echo with "
                               "logprobs gives the prompt's.", V),
    "logprobs_mode": done("raw (default) or processed logprobs.", OURS),
    "request_timeout": done("Seconds this request may take; the shorter of it and the "
                            "server's --request-timeout wins.", OURS),
    "request_id": refused("Send the id in the X-Request-Id header instead.", V),
    "return_tokens_as_token_ids": refused("Not offered.", V),
    "return_token_ids": refused("Not offered.", V),
    "cache_salt": refused("The prefix cache is shared by all requests; it cannot be "
                          "salted.", V),
    "kv_transfer_params": refused("Disaggregated serving is not offered.", V),
    "vllm_xargs": refused("Not offered.", V),
    "logits_processors": refused("Custom logits processors cannot be loaded per request.",
                                 V),
}

COMPLETION_FIELDS: dict[str, FieldRule] = {
    **SHARED,
    "prompt": done("Text, token ids, or a list of either."),
    "echo": done("The choice's text and logprobs begin with the prompt's."),
    "logprobs": done("Top logprobs per token, 0 to 20."),
    "suffix": refused("Insertion (fill in the middle) is not offered."),
    "add_special_tokens": refused("The tokenizer's default special tokens are always added.",
                                  V, True),
    "prompt_embeds": refused("Prompts are text or token ids.", V),
}

CHAT_FIELDS: dict[str, FieldRule] = {
    **SHARED,
    "messages": done("Rendered with the model's chat template; a message's name is passed "
                     "to it."),
    "max_completion_tokens": done("max_tokens' newer name; it wins when both are given."),
    "logprobs": done("Logprobs of the answer's tokens."),
    "top_logprobs": done("Top logprobs per token, 0 to 20; needs logprobs."),
    "tools": done("Function tools; see Tools."),
    "tool_choice": done("none, auto, required, or one named function; see Tools."),
    "parallel_tool_calls": done("false: at most one call per answer."),
    "functions": done("The legacy form of tools, read as function tools."),
    "function_call": done("The legacy form of tool_choice."),
    "metadata": no_effect("Tags for stored completions; nothing is stored here."),
    "store": no_effect("Completions are not stored for later retrieval."),
    "service_tier": no_effect("There is one tier."),
    "safety_identifier": no_effect("An end-user id for the provider's abuse monitoring."),
    "prompt_cache_key": no_effect("The prefix cache finds shared prefixes by itself."),
    "prompt_cache_retention": no_effect("The prefix cache keeps blocks until it needs the "
                                        "room."),
    "prompt_cache_options": no_effect("The prefix cache needs no options."),
    "prediction": no_effect("Predicted outputs only speed generation up; the answer is the "
                            "same without them."),
    "verbosity": no_effect("A hint to reasoning models; this one takes no such hint."),
    "moderation": refused("No moderation is run."),
    "modalities": refused("Only text is generated.", Origin.OPENAI, ["text"], []),
    "audio": refused("Only text is generated."),
    "reasoning_effort": done("none or minimal: no thinking (the chat template's "
                             "enable_thinking: false); other values leave a thinking model's "
                             "thinking on. No effect on a model that does not think."),
    "thinking_token_budget": done("Thinking tokens at most; then the server ends the thinking "
                                  "and the answer follows. No effect on a model that does not "
                                  "think.", V),
    "web_search_options": refused("Web search is not offered."),
    "echo": refused("Not offered on chat; /v1/completions echoes its prompt.", V),
    "add_generation_prompt": refused("The assistant's turn is always opened.", V, True),
    "continue_final_message": refused("A final assistant message is not continued.", V),
    "add_special_tokens": refused("The chat template's own special tokens are used.", V),
    "documents": refused("Documents are not passed to the chat template.", V),
    "chat_template": refused("The model's own chat template is used.", V),
    "chat_template_kwargs": done("Variables for the chat template, e.g. Qwen3's "
                                "enable_thinking: false; one the template does not use changes "
                                "nothing. Those the server sets (messages, tools, "
                                "add_generation_prompt, ...) are a 400.", V),
    "mm_processor_kwargs": refused("Only text is served.", V),
}

# OpenAI's CreateResponse, translated into a chat request (api/responses/protocol.py).
RESPONSE_FIELDS: dict[str, FieldRule] = {
    "model": SHARED["model"],
    "input": done("A string, or a list of messages, function_call and function_call_output "
                  "items (text only)."),
    "instructions": done("A system message before the input."),
    "stream": done("Server-sent events in the Responses API's event sequence."),
    "max_output_tokens": done("Output tokens at most; default: as many as fit."),
    "temperature": SHARED["temperature"],
    "top_p": SHARED["top_p"],
    "tools": done("Function tools; see Responses API."),
    "tool_choice": done("none, auto, required, or one named function."),
    "parallel_tool_calls": done("false: at most one call per answer."),
    "text": done("format: text, json_object or json_schema, through llguidance; verbosity "
                 "has no effect."),
    "metadata": done("Echoed in the response; nothing is stored."),
    "store": no_effect("This server is stateless: responses are never stored."),
    "previous_response_id": refused("This server is stateless and stores no responses; send "
                                    "the whole conversation in input."),
    "conversation": refused("This server is stateless and keeps no conversations; send the "
                            "whole conversation in input."),
    "background": refused("Responses run in the foreground only; nothing is stored to poll."),
    "prompt": refused("Stored prompt templates are not offered."),
    "include": refused("No extra output data is offered (no logprobs, no built-in tools' "
                       "results)."),
    "top_logprobs": refused("Logprobs are not offered here; /v1/chat/completions has them.",
                            Origin.OPENAI, 0),
    "reasoning": done("effort none or minimal: no thinking; other values leave a thinking "
                      "model's thinking on (its reasoning comes as a reasoning item). summary "
                      "has no effect: the reasoning is given whole."),
    "truncation": refused("Input is never truncated; too long an input is a 400.",
                          Origin.OPENAI, "disabled"),
    "context_management": refused("Context compaction is not offered."),
    "moderation": CHAT_FIELDS["moderation"],
    "max_tool_calls": no_effect("Limits built-in tool calls, and none are offered."),
    "stream_options": no_effect("With stream only; include_obfuscation: no obfuscation "
                                "padding is sent."),
    "user": SHARED["user"],
    "request_timeout": SHARED["request_timeout"],
    **{name: CHAT_FIELDS[name] for name in ("service_tier", "safety_identifier",
                                            "prompt_cache_key", "prompt_cache_retention",
                                            "prompt_cache_options")},
}

A = Origin.ANTHROPIC

# Anthropic's Messages API: fields that shape the prompt, which count_tokens reads too.
MESSAGES_PROMPT: dict[str, FieldRule] = {
    "model": done("The served model's name, or \"default\"; any other is a 404.", A),
    "messages": done("user and assistant turns of text, tool_use and tool_result blocks, "
                     "rendered as chat messages; see Anthropic Messages API.", A),
    "system": done("A string or text blocks: the system turn.", A),
    "tools": done("Client tools (name, description, input_schema), as function tools.", A),
    "tool_choice": done("auto, any (required), tool (a named choice), none; "
                        "disable_parallel_tool_use: at most one call.", A),
    "cache_control": no_effect("The prefix cache finds shared prefixes by itself; no "
                               "breakpoints are needed.", A),
    "speed": no_effect("There is one speed.", A),
    "user_profile_id": no_effect("Nothing is attributed or billed here.", A),
    "workspace_id": no_effect("There are no workspaces; the API key alone decides access.",
                              A),
    "thinking": done("enabled (budget_tokens: thinking tokens at most), adaptive, or "
                     "disabled: a thinking model's thinking on, on, or off (its reasoning comes "
                     "as thinking blocks). No effect on a model that does not think.", A),
    "output_config": refused("Neither structured outputs (format) nor effort levels are "
                             "offered here; /v1/chat/completions takes response_format.", A),
    "output_format": refused("Structured outputs are not offered here; "
                             "/v1/chat/completions takes response_format.", A),
}

MESSAGES_FIELDS: dict[str, FieldRule] = {
    **MESSAGES_PROMPT,
    "max_tokens": done("Required: output tokens at most.", A),
    "stream": done("Anthropic's server-sent events, message_start to message_stop.", A),
    "stop_sequences": done("Stop strings; the one that matched comes back as "
                           "stop_sequence.", A),
    "temperature": done("0 is greedy.", A),
    "top_p": done("Nucleus sampling.", A),
    "top_k": done("Top-k sampling; 0 is off.", A),
    "metadata": no_effect("user_id, for the provider's abuse monitoring; not used here.", A),
    "service_tier": no_effect("There is one tier.", A),
    "inference_geo": no_effect("The answer is computed on this server.", A),
    "container": refused("Code execution containers are not offered.", A),
    # The anthropic client's tool runner asks for a thread by default; this code tells it to
    # send the whole conversation instead.
    "thread": FieldRule(Status.REFUSED, A, "No conversation is kept between requests: send "
                        "the whole conversation.", (False,), code="thread_unsupported_request"),
    "compaction": refused("Conversations are not summarized here.", A),
    "fallbacks": no_effect("The model served never declines a request, so no fallback is "
                           "tried.", A),
    "fallback_credit_token": no_effect("No prompt cache is billed here.", A),
    "billing_policy": no_effect("Nothing is billed here.", A),
    "diagnostics": refused("Prompt-cache diagnostics are not reported.", A),
    "mcp_servers": refused("MCP servers are not called by this server.", A),
    "context_management": refused("The context is never edited; a history too long is a "
                                  "400.", A),
}

# What every embedding endpoint reads besides its inputs.
EMBEDDING_SHARED: dict[str, FieldRule] = {
    "model": SHARED["model"],
    "truncate_prompt_tokens": done("Cut a longer input to this many tokens (-1: the model's "
                                   "most), as sentence-transformers does; without it a longer "
                                   "input is a 400.", V),
    "priority": SHARED["priority"],
    "request_timeout": SHARED["request_timeout"],
}

EMBEDDING_FIELDS: dict[str, FieldRule] = {
    **EMBEDDING_SHARED,
    "input": done("Text, token ids, or a list of either (up to 2048 inputs)."),
    "prompt_name": done("One of the model's task prompts (its config_sentence_transformers."
                        "json, e.g. query or document), put before each text; default: the "
                        "model's default_prompt_name, if any.", OURS),
    "encoding_format": done("float, or base64 (little-endian float32)."),
    "dimensions": done("A Matryoshka size the model was trained for: the embedding is cut "
                       "to it, then normalized again."),
    "user": SHARED["user"],
}

RERANK_FIELDS: dict[str, FieldRule] = {
    **EMBEDDING_SHARED,
    "query": done("The query, embedded with the model's query prompt.", V),
    "documents": done("Texts (or {text} objects), embedded with the model's document "
                      "prompt; each scored by its cosine with the query.", V),
    "top_n": done("Only the n best documents.", V),
    "return_documents": done("Each result carries its document's text.", V),
    "prompt_name": refused("The query and the documents take the model's query and "
                           "document prompts.", OURS),
}

SCORE_FIELDS: dict[str, FieldRule] = {
    **EMBEDDING_SHARED,
    "text_1": done("One text, or a list: the queries (query prompt).", V),
    "text_2": done("One text, or a list: the documents (document prompt); each scored by "
                   "its cosine with its query.", V),
    "prompt_name": RERANK_FIELDS["prompt_name"],
}

POLICIES: dict[str, dict[str, FieldRule]] = {COMPLETIONS: COMPLETION_FIELDS,
                                             CHAT: CHAT_FIELDS,
                                             RESPONSES: RESPONSE_FIELDS,
                                             MESSAGES: MESSAGES_FIELDS,
                                             COUNT_TOKENS: MESSAGES_PROMPT,
                                             EMBEDDINGS: EMBEDDING_FIELDS,
                                             RERANK: RERANK_FIELDS,
                                             SCORE: SCORE_FIELDS}

_warned: set[str] = set()
_warned_lock = threading.Lock()


def check_fields(endpoint: str, fields: dict[str, Any], accept_unknown: bool = False) -> None:
    """Apply `endpoint`'s table to the fields a body was sent with: APIError (400) naming
    the first refused field that asks for something, or the first that no API defines
    (with `accept_unknown`, a warning once per name instead)."""
    table = POLICIES[endpoint]
    for name, value in fields.items():
        rule = table.get(name)
        if rule is None:
            if not accept_unknown:
                raise APIError(f"Unrecognized request field '{name}': {endpoint} has no such "
                               "field (a misspelling?).", name)
            warn_unknown(name)
        elif rule.status is Status.REFUSED and rule.asks_for(value):
            raise APIError(f"{name} is not supported by this server: {rule.reason}", name,
                           code=rule.code)


def warn_unknown(name: str) -> None:
    """Log, the first time only, that a field no API defines was sent and is ignored."""
    with _warned_lock:
        if name in _warned:
            return
        _warned.add(name)
    log.warning("Ignoring the request field %r, which no API defines (logged once).", name)


def render_markdown() -> str:
    """Every field of every endpoint as one markdown table per endpoint, for the API docs."""
    parts = []
    for endpoint, table in POLICIES.items():
        parts += [f"### `{endpoint}`", "", "| Field | From | Status | Notes |",
                  "|---|---|---|---|"]
        for name in sorted(table):
            rule = table[name]
            parts.append(f"| `{name}` | {rule.origin} | {rule.status} | {rule.reason} |")
        parts.append("")
    return "\n".join(parts)


if __name__ == "__main__":
    print(render_markdown())
