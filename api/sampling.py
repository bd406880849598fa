"""The fields every generating body shares (completions, chat; the Responses and Messages
APIs translate into chat's): the model, streaming, the sampling fields, and their
translation into the engine's SamplingParams (`to_sampling_params`), each refusal a 400
naming its field.
"""

from __future__ import annotations

import math
from typing import Annotated, ClassVar

from pydantic import (
    ConfigDict,
    Field,
)

from api.errors import APIError
from api.protocol import (
    MIN_REQUEST_TIMEOUT,
    APIModel,
    NonEmptyText,
    NullFalse,
    RequestBody,
    TokenId,
    TokenIds,
    or_null,
)
from api.structured import grammar_spec
from engine.logprobs import DEFAULT_LOGPROBS_MODE, LogprobsMode
from engine.request import SamplingParams
from engine.structured.grammar import GrammarSpec

# Below this a temperature is greedy (as in vLLM): dividing logits by a tinier one overflows.
GREEDY_TEMPERATURE = 1e-5
PRIORITY_BOUND = 2**31  # a 32-bit signed priority: room for any ordering, exact in a float key


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
        check_priority(self.priority, scheduling_policy)

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


def check_priority(priority: int, scheduling_policy: str) -> None:
    """priority is honoured only under --scheduling-policy priority: refused otherwise."""
    if not -PRIORITY_BOUND <= priority < PRIORITY_BOUND:
        raise APIError(f"priority must be in [-{PRIORITY_BOUND}, {PRIORITY_BOUND}).",
                       "priority")
    if priority != 0 and scheduling_policy != "priority":
        raise APIError("priority is honoured only by a server started with "
                       "--scheduling-policy priority; this one serves first come first "
                       "served.", "priority")
