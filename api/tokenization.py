"""POST /tokenize and /detokenize, in vLLM's request and response shapes.

/tokenize takes a `prompt` (completions' text) or `messages` (with the tools offered, if
any, rendered exactly as chat completions renders them); /detokenize turns token ids back
into text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import jinja2
from pydantic import ConfigDict, Field

from api.engine_client import EngineClient
from api.errors import APIError
from api.openai.bodies import DetokenizeResponse, TokenizeResponse
from api.openai.protocol import TOOL_RULES, ChatMessage, TemplateFields, ToolFields
from api.protocol import NullFalse, RequestBody, TokenId, or_null
from api.tools.formats import GENERIC, CallFormat
from api.tools.plan import ToolPlan, tool_plan
from api.tools.prompt import render_messages, template_renders_tools

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


NO_CHAT_TEMPLATE = ("This model has no chat template, so chat messages cannot be rendered. "
                    "Send a plain prompt to /v1/completions instead, or start the server with "
                    "--chat-template FILE.")


def render_chat(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]],
                add_generation_prompt: bool, **template_args: Any) -> str:
    """The messages as text, through the tokenizer's chat template (the folder's, or the one
    --chat-template gave), given `template_args` too (e.g. tools); a 400 if there is none."""
    if not getattr(tokenizer, "chat_template", None):
        raise APIError(NO_CHAT_TEMPLATE, "messages", code="chat_template_missing")
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=add_generation_prompt,
                                             **template_args)
    except jinja2.TemplateError as exc:  # e.g. the template's raise_exception on roles
        raise APIError(f"The chat template could not render these messages: {exc}",
                       "messages") from exc


def chat_prompt(tokenizer: PreTrainedTokenizerBase, messages: list[ChatMessage],
                plan: ToolPlan | None, add_generation_prompt: bool = True,
                variables: dict[str, Any] | None = None, form: CallFormat = GENERIC) -> str:
    """The text a chat request runs: its messages (tool calls and results included) and the
    tools it offers, through the chat template, with the request's own template `variables`
    (chat_template_kwargs; one the template does not use changes nothing); calls in the
    history written in `form` where the template does not render them itself."""
    rendered, tools = render_messages(messages, plan, template_renders_tools(tokenizer), form)
    extra = {**(variables or {}), **({"tools": tools} if tools else {})}
    return render_chat(tokenizer, rendered, add_generation_prompt, **extra)


class TokenizeRequest(RequestBody, ToolFields, TemplateFields):
    """Exactly one of `prompt` and `messages` (oneOf in the document)."""

    model_config = ConfigDict(extra="forbid")
    SCHEMA_RULES = ({"oneOf": [
        {"properties": {"prompt": {"type": "string"}}, "required": ["prompt"]},
        {"properties": {"messages": {"type": "array"}}, "required": ["messages"]}]},
        *TOOL_RULES)

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    add_special_tokens: bool | None = None  # default: True for a prompt, False for messages
    add_generation_prompt: Annotated[bool, *or_null("boolean", True)] = True  # messages only
    return_token_strs: NullFalse = False

    def tool_plan(self) -> ToolPlan | None:
        """The tools offered with `messages` (ToolFields, as chat takes them)."""
        if self.messages is None:
            for name in ToolFields.model_fields:
                if getattr(self, name) is not None:
                    raise APIError(f"'{name}' goes with 'messages'; a prompt has no tools.",
                                   name)
        return tool_plan(self)


class DetokenizeRequest(RequestBody):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    tokens: list[TokenId]


class TokenizationServing:
    def __init__(self, engine: EngineClient, accepted_model_names: set[str],
                 form: CallFormat = GENERIC) -> None:
        self.form = form  # the model's tool-call format, as chat renders history in it
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.accepted_model_names = accepted_model_names

    def check_model(self, model: str | None) -> None:
        if model is not None and model not in self.accepted_model_names:
            raise APIError(f"The model '{model}' does not exist.", "model",
                           status=404, code="model_not_found")

    def tokenize(self, body: TokenizeRequest) -> TokenizeResponse:
        self.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError("Send either 'prompt' or 'messages'.", "prompt")
        plan = body.tool_plan()
        if body.messages is not None:
            text = chat_prompt(self.tokenizer, body.messages, plan, body.add_generation_prompt,
                               body.template_variables(), self.form)
            add_special = bool(body.add_special_tokens)
        else:
            text, add_special = body.prompt, body.add_special_tokens is not False
        ids = self.tokenizer(text, add_special_tokens=add_special).input_ids
        return TokenizeResponse(
            count=len(ids), max_model_len=self.engine.max_tokens_per_request, tokens=ids,
            token_strs=self.tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs
            else None)

    def detokenize(self, body: DetokenizeRequest) -> DetokenizeResponse:
        self.check_model(body.model)
        vocab_size = len(self.tokenizer)
        if any(not 0 <= t < vocab_size for t in body.tokens):
            raise APIError(f"Token ids in 'tokens' must be in [0, {vocab_size}).", "tokens")
        return DetokenizeResponse(prompt=self.tokenizer.decode(body.tokens))
