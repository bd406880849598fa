"""OpenAI API request bodies, as far as we serve them: strict types for the fields we read.

Each body translates itself into the engine's terms (`to_sampling_params`), and says what
it asks for that this server does not do (`check_supported`, from api/field_policy.py's
table of every field each endpoint may be sent).
Both raise APIError, which becomes a 400 naming the field.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    WithJsonSchema,
    model_validator,
)

from api.errors import APIError
from api.field_policy import CHAT, COMPLETIONS, check_fields
from api.structured import grammar_spec
from api.tools.plan import ToolPlan, tool_plan
from engine.logprobs import DEFAULT_LOGPROBS_MODE, MAX_TOP_LOGPROBS, LogprobsMode
from engine.request import SamplingParams
from engine.structured.grammar import GrammarSpec

# Below this a temperature is greedy (as in vLLM): dividing logits by a tinier one overflows.
GREEDY_TEMPERATURE = 1e-5
PRIORITY_BOUND = 2**31  # a 32-bit signed priority: room for any ordering, exact in a float key
# The shortest deadline a request may ask for. Below a millisecond no engine step (on any
# device this server runs on) completes, so such a deadline could only ever end in a 504:
# it is refused as a mistake instead (5e-324 is a float, not a deadline).
MIN_REQUEST_TIMEOUT = 0.001

NonEmptyText = Annotated[str, Field(min_length=1)]

# A token id. Its upper bound is the model's vocabulary: /openapi.json states it where this
# marker stands (api/openapi.py).
TOKEN_ID_MARKER = "x-token-id"


def integral_float_as_int(value: object) -> object:
    """JSON has one kind of number, and JSON Schema's "integer" takes 7.0: so do we, for
    token ids (7.5 still fails as not an integer)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def or_null(json_type: str, default: object) -> tuple[BeforeValidator, WithJsonSchema]:
    """A field whose null means its default (the OpenAI client sends null for a None it is
    given, and OpenAI's API and vLLM read it so), documented as taking null."""
    return (BeforeValidator(lambda value: default if value is None else value),
            WithJsonSchema({"anyOf": [{"type": json_type}, {"type": "null"}]}))


NullFalse = Annotated[bool, *or_null("boolean", False)]


TokenId = Annotated[int, Field(ge=0, json_schema_extra={TOKEN_ID_MARKER: True}),
                    BeforeValidator(integral_float_as_int)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]


class APIModel(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


def broken_text_at(value: Any) -> str | None:
    """Where in a parsed JSON body a string (a value or a key) holds a lone UTF-16 surrogate
    (JSON lets "\\ud800" through, and no text can be encoded from it), or None. One pass of
    the C encoder answers for a whole body; only a body that fails it is walked (by hand, so
    that no nesting is too deep), to name the place."""
    try:
        json.dumps(value, ensure_ascii=False, default=str).encode("utf-8")
        return None
    except UnicodeEncodeError:
        pass
    except (RecursionError, ValueError):
        return None  # too deep or circular for the encoder: the validation says what is wrong
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str) and not is_unicode(node):
            return render_path(path)
        if isinstance(node, dict):
            for key, item in node.items():
                if not is_unicode(str(key)):
                    return render_path(path) + " (a key)" if path else "a key of the body"
                stack.append((item, (*path, key)))
        elif isinstance(node, list):
            stack.extend((item, (*path, i)) for i, item in enumerate(node))
    return None


def is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def render_path(path: tuple[str | int, ...]) -> str:
    """messages[0].content: keys joined by dots (each cut to 40 characters), indexes in []."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f"{'.' if out else ''}{part[:40]}"
    return out or "the body"


def not_both(a: str, b: str) -> dict[str, Any]:
    """A JSON Schema rule: fields `a` and `b` are not both given (null counts as absent)."""
    given = {"not": {"type": "null"}}
    return {"not": {"properties": {a: given, b: given}, "required": [a, b]}}


def needs(field: str, other: str, value: Any) -> dict[str, Any]:
    """A JSON Schema rule: `field`, when given (not null), needs `other` to be `value`."""
    return {"if": {"properties": {field: {"not": {"type": "null"}}}, "required": [field]},
            "then": {"properties": {other: {"const": value}}, "required": [other]}}


def add_schema_rules(schema: dict[str, Any], cls: type) -> None:
    """The document's body schema gets the class's SCHEMA_RULES (and stream_options' need of
    stream where the body has both), in an allOf."""
    rules = list(getattr(cls, "SCHEMA_RULES", ()))
    if "stream_options" in getattr(cls, "model_fields", {}):
        rules.append(needs("stream_options", "stream", True))
    if rules:
        schema.setdefault("allOf", []).extend(rules)


class RequestBody(APIModel):
    """A request's whole body: text that is not Unicode (a lone surrogate) is refused before
    anything reads it, with a 400 naming where it is; a generating endpoint's body (one with
    an ENDPOINT) is judged field by field by api/field_policy.py.

    SCHEMA_RULES: what the document states of the body beyond each field's own schema (rules
    between fields), each one the server enforces with a 400."""

    model_config = ConfigDict(json_schema_extra=add_schema_rules)
    ENDPOINT: ClassVar[str]
    SCHEMA_RULES: ClassVar[tuple[dict[str, Any], ...]] = ()

    def sent_fields(self) -> dict[str, Any]:
        """Every field the body was sent with, declared or not, and its value."""
        sent = {name: getattr(self, name) for name in self.model_fields_set}
        return {**sent, **(self.model_extra or {})}

    def check_supported(self, accept_unknown: bool = False) -> None:
        """A 400 for a field this endpoint refuses, or one no API defines (with
        `accept_unknown`: a logged warning); stream_options only with stream, as on
        OpenAI's API."""
        check_fields(self.ENDPOINT, self.sent_fields(), accept_unknown)
        if ("stream_options" in type(self).model_fields and self.stream_options is not None
                and not self.stream):
            raise APIError("stream_options is only allowed with stream: true.",
                           "stream_options")

    @model_validator(mode="before")
    @classmethod
    def whole_characters(cls, value: Any) -> Any:
        where = broken_text_at(value)
        if where is not None:  # an APIError passes through pydantic to the error handler
            raise APIError(f"{where} holds a lone UTF-16 surrogate (such as \\ud800), which "
                           "is not Unicode text.", where)
        return value


class StreamOptions(APIModel):
    include_usage: NullFalse = False
    continuous_usage_stats: NullFalse = False  # vLLM's: usage so far in every chunk


class SamplingFields(RequestBody):
    """What completions and chat share: the model, streaming and the sampling fields.
    Fields not declared here are kept (in model_extra) for the field policy to judge."""

    model_config = ConfigDict(strict=True, extra="allow")
    PROMPT_FIELD: ClassVar[str] = "prompt"  # what an error about the prompt names

    model: str | None = None
    stream: NullFalse = False
    stream_options: StreamOptions | None = None
    # Ours (vLLM has none): seconds from arrival this request may take; on top of the
    # server's --request-timeout, the shorter wins. Past it: 504, or an error event once
    # streaming.
    request_timeout: float | None = Field(default=None, ge=MIN_REQUEST_TIMEOUT,
                                          allow_inf_nan=False)
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: NullFalse = False
    min_tokens: Annotated[int, *or_null("integer", 0)] = 0
    n: Annotated[int, *or_null("integer", 1)] = 1
    best_of: int | None = None  # run this many samples, return the n of highest logprob
    logprobs_mode: LogprobsMode | None = None  # ours: "raw" (default) or "processed"
    user: str | None = None
    # Lower is seated first (vLLM's convention); needs --scheduling-policy priority.
    priority: Annotated[int, *or_null("integer", 0)] = 0
    # Logits processors (engine/logits_processors.py).
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None  # vLLM's
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> bias
    min_p: float | None = None  # vLLM's
    allowed_token_ids: TokenIds | None = None  # vLLM's
    # Structured outputs (api/structured.py): OpenAI's response_format, on both endpoints;
    # vLLM's structured_outputs and its older guided_* fields.
    response_format: dict | None = None
    structured_outputs: dict | None = None
    guided_json: dict | str | None = None
    guided_regex: str | None = Field(default=None, json_schema_extra={"minLength": 1})
    guided_choice: Annotated[list[NonEmptyText], Field(min_length=1)] | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream and self.stream_options
                    and self.stream_options.continuous_usage_stats)

    def requested_max_tokens(self) -> int | None:
        """max_tokens as asked; None: as many as fit."""
        return self.max_tokens

    def max_tokens_field(self) -> str:
        """The field requested_max_tokens read, for errors to name."""
        return "max_tokens"

    def min_max_tokens(self) -> int:
        """The least max_tokens allowed (completions allow 0 with echo)."""
        return 1

    def sampled_logprobs(self) -> int | None:
        """Top logprobs asked for per sampled token (None: no logprobs)."""
        return None

    def prompt_logprobs(self) -> int | None:
        """Top logprobs asked for per prompt token (None: no prompt logprobs)."""
        return None

    def num_samples(self) -> int:
        """Samples run per prompt: best_of, else n."""
        return self.best_of or self.n

    def check_samples(self, max_samples: int) -> None:
        """n and best_of: in range, and at most max_samples (the engine's seats)."""
        if self.n < 1:
            raise APIError("n must be at least 1.", "n")
        if self.best_of is not None and self.best_of < self.n:
            raise APIError("best_of must be at least n.", "best_of")
        field = "best_of" if self.best_of is not None else "n"
        if self.num_samples() > max_samples:
            raise APIError(f"{field} must be at most {max_samples} (this server's seats, "
                           "--max-num-seqs).", field)
        if self.stream and self.num_samples() > self.n:
            raise APIError("best_of above n cannot be streamed: the best are known only at "
                           "the end.", "best_of")
        if self.requested_max_tokens() == 0 and self.num_samples() > 1:
            raise APIError("n and best_of above 1 need max_tokens of at least 1.", field)

    def check_priority(self, scheduling_policy: str) -> None:
        """priority is honoured only under --scheduling-policy priority: refused otherwise."""
        if not -PRIORITY_BOUND <= self.priority < PRIORITY_BOUND:
            raise APIError(f"priority must be in [-{PRIORITY_BOUND}, {PRIORITY_BOUND}).",
                           "priority")
        if self.priority != 0 and scheduling_policy != "priority":
            raise APIError("priority is honoured only by a server started with "
                           "--scheduling-policy priority; this one serves first come first "
                           "served.", "priority")

    def to_sampling_params(self, num_prompt_tokens: int, max_model_len: int,
                           vocab_size: int) -> SamplingParams:
        """The engine's SamplingParams; APIError for a value out of range. `max_model_len`
        bounds prompt + completion, `vocab_size` the token ids."""
        max_tokens = self._max_tokens(num_prompt_tokens, max_model_len)
        logprobs = self.sampled_logprobs()
        if logprobs is None and self.num_samples() > self.n:
            logprobs = 0  # best_of ranks samples by their cumulative logprob
        return SamplingParams(
            max_tokens=max_tokens, temperature=self._temperature(), top_p=self._top_p(),
            top_k=self._top_k(), min_tokens=self._min_tokens(max_tokens), seed=self._seed(),
            stop=self._stop(), stop_token_ids=self._stop_token_ids(vocab_size),
            ignore_eos=self.ignore_eos, logprobs=logprobs,
            prompt_logprobs=self.prompt_logprobs(), n=self.num_samples(),
            logprobs_mode=self.logprobs_mode or DEFAULT_LOGPROBS_MODE,
            presence_penalty=self._penalty("presence_penalty"),
            frequency_penalty=self._penalty("frequency_penalty"),
            repetition_penalty=self._repetition_penalty(),
            logit_bias=self._logit_bias(vocab_size), min_p=self._min_p(),
            allowed_token_ids=self._allowed_token_ids(vocab_size))

    def grammar_spec(self) -> GrammarSpec | None:
        """The structured output asked for, if any; APIError if it is malformed."""
        return grammar_spec(self)

    def _penalty(self, field: str) -> float:
        value = getattr(self, field)
        value = 0.0 if value is None else value
        if not -2 <= value <= 2:
            raise APIError(f"{field} must be between -2 and 2.", field)
        return value

    def _repetition_penalty(self) -> float:
        value = 1.0 if self.repetition_penalty is None else self.repetition_penalty
        if not (math.isfinite(value) and value > 0):
            raise APIError("repetition_penalty must be a finite number above 0 (1 = off).",
                           "repetition_penalty")
        return value

    def _logit_bias(self, vocab_size: int) -> dict[int, float]:
        bias: dict[int, float] = {}
        for key, value in (self.logit_bias or {}).items():
            try:
                token = int(key)
            except ValueError:
                token = -1
            if not 0 <= token < vocab_size:
                raise APIError(f"logit_bias keys must be token ids in [0, {vocab_size}); got "
                               f"{key!r}.", "logit_bias")
            if not -100 <= value <= 100:
                raise APIError("logit_bias values must be between -100 and 100.", "logit_bias")
            bias[token] = value
        return bias

    def _min_p(self) -> float:
        value = 0.0 if self.min_p is None else self.min_p
        if not 0 <= value <= 1:
            raise APIError("min_p must be between 0 and 1.", "min_p")
        return value

    def _allowed_token_ids(self, vocab_size: int) -> list[int] | None:
        ids = self.allowed_token_ids
        if ids is None:
            return None
        if not ids or any(not 0 <= t < vocab_size for t in ids):
            raise APIError(f"allowed_token_ids must be a non-empty list of token ids in "
                           f"[0, {vocab_size}).", "allowed_token_ids")
        return list(ids)

    def _max_tokens(self, num_prompt_tokens: int, max_model_len: int) -> int:
        max_tokens = self.requested_max_tokens()
        room = max_model_len - num_prompt_tokens
        if room < (1 if max_tokens != 0 else 0):
            subject = ("The prompt" if self.PROMPT_FIELD == "prompt"
                       else f"The prompt rendered from {self.PROMPT_FIELD}")
            raise APIError(f"{subject} is {num_prompt_tokens} tokens; this server holds at most "
                           f"{max_model_len} tokens per request (prompt + completion).",
                           self.PROMPT_FIELD, code="context_length_exceeded")
        if max_tokens is None:
            return room
        field = self.max_tokens_field()
        if max_tokens < self.min_max_tokens():
            raise APIError(f"{field} must be at least {self.min_max_tokens()} (0 is "
                           "allowed only with echo, on /v1/completions).", field)
        if max_tokens > room:
            raise APIError(f"The prompt ({num_prompt_tokens} tokens) plus {field} "
                           f"({max_tokens}) exceeds the {max_model_len} tokens this server "
                           f"holds per request. Shorten the prompt or lower {field}.",
                           field, code="context_length_exceeded")
        return max_tokens

    def _temperature(self) -> float:
        temperature = 1.0 if self.temperature is None else self.temperature
        if not (math.isfinite(temperature) and temperature >= 0):  # NaN would fail the step
            raise APIError("temperature must be a finite number of at least 0.", "temperature")
        return 0.0 if temperature < GREEDY_TEMPERATURE else temperature

    def _top_p(self) -> float:
        top_p = 1.0 if self.top_p is None else self.top_p
        if not 0 < top_p <= 1:
            raise APIError("top_p must be in (0, 1].", "top_p")
        return top_p

    def _top_k(self) -> int:
        top_k = self.top_k or 0
        if top_k < -1:
            raise APIError("top_k must be -1 or 0 (off), or a positive number.", "top_k")
        return max(top_k, 0)

    def _min_tokens(self, max_tokens: int) -> int:
        if not 0 <= self.min_tokens <= max_tokens:
            raise APIError("min_tokens must be between 0 and max_tokens.", "min_tokens")
        return self.min_tokens

    def _seed(self) -> int | None:
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            raise APIError("seed must be an integer in [-2**63, 2**64).", "seed")
        return self.seed

    def _stop(self) -> list[str]:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not s for s in stop):
            raise APIError("stop strings must not be empty.", "stop")
        return stop

    def _stop_token_ids(self, vocab_size: int) -> list[int]:
        ids = list(self.stop_token_ids or [])
        if any(not 0 <= t < vocab_size for t in ids):
            raise APIError(f"stop_token_ids must be token ids in [0, {vocab_size}).",
                           "stop_token_ids")
        return ids


def check_top_logprobs(value: int | None, field: str) -> None:
    if value is not None and not 0 <= value <= MAX_TOP_LOGPROBS:
        raise APIError(f"{field} must be between 0 and {MAX_TOP_LOGPROBS}.", field)


class CompletionRequest(SamplingFields):
    ENDPOINT: ClassVar[str] = COMPLETIONS
    # Text, token ids, or a list of either: each prompt gets n choices of its own. None may
    # be empty: an empty prompt has nothing to continue.
    prompt: (NonEmptyText | TokenIds | Annotated[list[NonEmptyText], Field(min_length=1)]
             | Annotated[list[TokenIds], Field(min_length=1)])
    max_tokens: int | None = 16
    echo: NullFalse = False  # the choice's text (and logprobs) begin with the prompt's
    logprobs: int | None = None

    def prompts(self) -> list[str | list[int]]:
        """Each prompt: text or token ids."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if self.prompt and isinstance(self.prompt[0], str | list):
            return list(self.prompt)  # type: ignore[arg-type]
        return [self.prompt]  # type: ignore[list-item]

    def min_max_tokens(self) -> int:
        return 0 if self.echo else 1

    def sampled_logprobs(self) -> int | None:
        check_top_logprobs(self.logprobs, "logprobs")
        return self.logprobs

    def prompt_logprobs(self) -> int | None:
        return self.logprobs if self.echo else None


class TextPart(APIModel):
    type: Literal["text"]
    text: str

    @model_validator(mode="before")
    @classmethod
    def text_only(cls, value: Any) -> Any:
        kind = value.get("type") if isinstance(value, dict) else None
        if isinstance(kind, str) and kind != "text":
            raise ValueError(f"a content part of type {kind!r}; this server reads text parts "
                             "only")
        return value


class ChatMessage(APIModel):
    # "function": the legacy form of a tool message (its name is the function's)
    role: Literal["system", "user", "assistant", "developer", "tool", "function"]
    content: str | list[TextPart] | None = None  # None: an assistant's tool calls only
    name: str | None = None
    tool_calls: list[dict] | None = None  # an assistant's (api/tools/prompt.py checks them)
    tool_call_id: str | None = None  # a tool message's: the call it answers
    function_call: dict | None = None  # an assistant's legacy call: {name, arguments}

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ToolFields(BaseModel):
    """Function tools (api/tools/plan.py), and their legacy form: what a chat body offers, and
    /tokenize's body to count the same prompt."""

    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict] | None = None
    function_call: str | dict | None = None


# The tool fields' rules: the new form or the legacy one, not both (tool_plan's 400s).
TOOL_RULES = (not_both("tools", "functions"), not_both("tool_choice", "function_call"))


class ChatCompletionRequest(SamplingFields, ToolFields):
    ENDPOINT: ClassVar[str] = CHAT
    PROMPT_FIELD: ClassVar[str] = "messages"
    # top_logprobs needs logprobs: true; tools or the legacy functions, not both.
    SCHEMA_RULES = (needs("top_logprobs", "logprobs", True), *TOOL_RULES)

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: NullFalse = False
    top_logprobs: int | None = None
    _tool_plan: tuple[ToolPlan | None] | None = PrivateAttr(default=None)

    def tool_plan(self) -> ToolPlan | None:
        """The tools offered and the choice asked for (None: no tools); read once."""
        if self._tool_plan is None:
            self._tool_plan = (tool_plan(self),)
        return self._tool_plan[0]

    def grammar_spec(self) -> GrammarSpec | None:
        """A tool call's grammar, or the structured output asked for; not both."""
        plan = self.tool_plan()
        spec = grammar_spec(self)
        if plan is None or not plan.may_call:
            return spec
        if spec is not None:
            raise APIError("A structured output cannot be combined with tools that may be "
                           "called; send tool_choice 'none' to use it.", spec.source)
        return plan.grammar_spec()

    def sampled_logprobs(self) -> int | None:
        check_top_logprobs(self.top_logprobs, "top_logprobs")
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError("top_logprobs needs logprobs: true.", "top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None

    def requested_max_tokens(self) -> int | None:
        """max_completion_tokens, else max_tokens; None: as many as fit."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    def max_tokens_field(self) -> str:
        return "max_tokens" if self.max_completion_tokens is None else "max_completion_tokens"
