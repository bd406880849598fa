"""OpenAI's completions and chat completions request bodies, over the fields every
generating body shares (api/sampling.py's SamplingFields): each translates itself into the
engine's terms and says what it asks for that this server does not do (api/field_policy.py).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, Field, PrivateAttr, model_validator

from api.errors import APIError
from api.field_policy import CHAT, COMPLETIONS
from api.protocol import APIModel, NonEmptyText, NullFalse, TokenIds, needs, not_both
from api.sampling import SamplingFields
from api.structured import grammar_spec
from api.tools.formats import GENERIC, CallFormat
from api.tools.plan import ToolPlan, tool_plan
from engine.logprobs import MAX_TOP_LOGPROBS
from engine.structured.grammar import GrammarSpec


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


# The chat template's own arguments, which a request's chat_template_kwargs may not set.
TEMPLATE_RESERVED = frozenset({
    "messages", "conversation", "tools", "documents", "add_generation_prompt",
    "continue_final_message", "tokenize", "chat_template", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs"})


class TemplateFields(BaseModel):
    """Variables for the chat template (vLLM's chat_template_kwargs: e.g. Qwen3's
    enable_thinking): what a chat body may pass, and /tokenize's body to count the same."""

    chat_template_kwargs: dict[str, Any] | None = None

    def template_variables(self) -> dict[str, Any]:
        """The variables, checked: names of identifiers, none the server sets itself."""
        variables = self.chat_template_kwargs or {}
        for name in variables:
            if not name.isidentifier():
                raise APIError(f"chat_template_kwargs: {name!r} is not a template variable's "
                               "name.", "chat_template_kwargs")
            if name in TEMPLATE_RESERVED:
                raise APIError(f"chat_template_kwargs: {name!r} is set by the server from the "
                               "request itself; send it in its own field, if the endpoint "
                               "has one.", "chat_template_kwargs")
        return variables


# The tool fields' rules: the new form or the legacy one, not both (tool_plan's 400s).
TOOL_RULES = (not_both("tools", "functions"), not_both("tool_choice", "function_call"))


class ChatCompletionRequest(SamplingFields, ToolFields, TemplateFields):
    ENDPOINT: ClassVar[str] = CHAT
    PROMPT_FIELD: ClassVar[str] = "messages"
    # top_logprobs needs logprobs: true; tools or the legacy functions, not both.
    SCHEMA_RULES = (needs("top_logprobs", "logprobs", True), *TOOL_RULES)

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    # A thinking model's switch and bound (api/thinking.py): OpenAI's effort, vLLM's budget.
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    thinking_token_budget: int | None = Field(default=None, ge=0)
    logprobs: NullFalse = False
    top_logprobs: int | None = None
    _tool_plan: tuple[ToolPlan | None] | None = PrivateAttr(default=None)

    def tool_plan(self) -> ToolPlan | None:
        """The tools offered and the choice asked for (None: no tools); read once."""
        if self._tool_plan is None:
            self._tool_plan = (tool_plan(self),)
        return self._tool_plan[0]

    def grammar_spec(self, form: CallFormat = GENERIC) -> GrammarSpec | None:
        """A tool call's grammar (calls written in `form`), or the structured output asked
        for; not both."""
        plan = self.tool_plan()
        spec = grammar_spec(self)
        if plan is None or not plan.may_call:
            return spec
        if spec is not None:
            raise APIError("A structured output cannot be combined with tools that may be "
                           "called; send tool_choice 'none' to use it.", spec.source)
        return plan.grammar_spec(form)

    def template_variables(self) -> dict[str, Any]:
        """The template's variables; reasoning_effort none or minimal sets enable_thinking
        false, unless chat_template_kwargs sets it itself."""
        variables = super().template_variables()
        if self.reasoning_effort in ("none", "minimal"):
            variables = {"enable_thinking": False, **variables}
        return variables

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
