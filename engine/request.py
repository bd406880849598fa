"""One request's state as it moves through the engine, and what the engine hands back to its
client (engine/step_types.py has what one step hands from part to part)."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from enum import Enum, StrEnum

import torch

from engine.logprobs import DEFAULT_LOGPROBS_MODE, LogprobsMode, TokenLogprobs
from engine.structured.grammar import CompiledGrammar, GrammarState
from engine.thinking import Phase, Thinking, ThinkingParams
from kvcache.kv_cache_manager import SequenceBlocks

# RequestOutput.error_code of requests the server could not finish; the API answers 503.
SHUTDOWN = "server_shutting_down"
ENGINE_FAILED = "engine_failed"


class FinishReason(StrEnum):
    STOP = "stop"  # a stop token, EOS or a stop string
    LENGTH = "length"  # max_tokens reached
    ABORT = "abort"  # the client went away
    ERROR = "error"  # the engine failed this request (see RequestOutput.error)
    TIMEOUT = "timeout"  # its deadline passed (see Request.timeout); RequestOutput.error says


@dataclass
class SamplingParams:
    max_tokens: int = 16  # 0: only the prompt is computed (for its prompt logprobs)
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0
    # None: no logprobs; k >= 0: the chosen token's logprob and the k most likely tokens.
    logprobs: int | None = None  # of each sampled token (also keeps cumulative_logprob)
    prompt_logprobs: int | None = None  # of each prompt token but the first (always raw)
    logprobs_mode: LogprobsMode = DEFAULT_LOGPROBS_MODE
    n: int = 1  # samples of the prompt: it is prefilled once, and its blocks shared
    # Logits processors (engine/logits_processors.py), applied before sampling.
    presence_penalty: float = 0.0  # subtracted once from each token already generated
    frequency_penalty: float = 0.0  # subtracted per time a token was generated
    repetition_penalty: float = 1.0  # tokens of prompt or output: logit / p if > 0, else * p
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to logit
    allowed_token_ids: list[int] | None = None  # None: all
    min_p: float = 0.0  # after temperature: drop tokens below min_p * the top probability
    grammar: CompiledGrammar | None = None  # structured output; each request gets a matcher
    # A thinking model's tags, and a budget for its thinking (engine/thinking.py).
    thinking: ThinkingParams | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def has_grammar(self) -> bool:
        return self.grammar is not None

    @property
    def needs_logits_processing(self) -> bool:
        """Anything beyond temperature / top-k / top-p changes the logits: penalties, bias,
        allowed tokens, min_p or a grammar (a speculative step must then leave it alone)."""
        return (self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1 or bool(self.logit_bias)
                or self.allowed_token_ids is not None or self.min_p > 0 or self.has_grammar)


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestTiming:
    """Where one request's time went (seconds), for the final output."""

    queue_time: float | None  # arrival to first seated
    time_to_first_token: float | None  # arrival to first output token
    decode_time: float | None  # first output token to last
    prompt_tokens_computed: int  # recomputations after a preemption included
    prompt_tokens_cached: int  # taken from the prefix cache when first seated
    num_preemptions: int


@dataclass
class RequestOutput:
    """What the engine hands back after a step: new text, and the end when it comes.

    `logprobs` (when asked) has one entry per token in token_ids, the stop token (EOS or
    stop_token_ids) included, though its text is not part of `text`. `prompt_logprobs` comes
    once, with a request's first output, one entry per prompt token (None for the first)."""

    request_id: str
    text: str
    token_ids: list[int]
    finished: bool = False
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    error: str | None = None
    error_code: str | None = None  # e.g. SHUTDOWN, ENGINE_FAILED (above)
    sample_index: int = 0
    logprobs: list[TokenLogprobs] | None = None
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    cumulative_logprob: float | None = None  # final output, when logprobs were kept
    timing: RequestTiming | None = None  # final output (a core process sends it with each: so far)
    stop_string: str | None = None  # final output: the stop string that ended it, if one did
    reasoning_tokens: int = 0  # thinking tokens so far (engine/thinking.py), tags not counted
    embedding: list[float] | None = None  # an embedding model's vector, with the last output


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    on_output: Callable[[RequestOutput], None]  # must be safe to call from the engine thread
    arrival_time: float = field(default_factory=time.monotonic)
    priority: int = 0  # --scheduling-policy priority: lower is seated first
    # Requests the HTTP process had taken in and not yet sent when it sent this one: after an
    # idle spell the first step waits for them (engine/arrivals.py).
    arrivals_behind: int = 0

    status: Status = Status.WAITING
    token_ids: list[int] = field(init=False)  # prompt, then every generated token
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    num_cached_tokens: int = 0  # prompt tokens taken from the prefix cache when first seated
    blocks: SequenceBlocks = field(default_factory=SequenceBlocks)
    generator: torch.Generator | None = None
    finish_reason: FinishReason | None = None
    timeout: float | None = None  # seconds from arrival, on top of --request-timeout
    scheduled_time: float | None = None  # first seated
    first_token_time: float | None = None
    last_token_time: float | None = None
    num_preemptions: int = 0
    num_computed_prompt_tokens: int = 0  # prompt tokens whose K/V this request computed
    # Samples (params.n > 1): the others wait here until this one's prompt is computed, then
    # share its blocks; each has its own id, sample_index and parent_id (this request's id).
    sample_index: int = 0
    parent_id: str | None = None
    pending_forks: list[Request] = field(default_factory=list)
    cumulative_logprob: float = 0.0  # of the sampled tokens, when params.logprobs is set
    # Speculative decoding: after drafts that all failed, none are tried for a few steps.
    draft_failures: int = 0  # drafts rejected whole in a row
    draft_pause: int = 0  # steps left without drafting
    # One entry per prompt token scored so far (None for the first), when asked for.
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    # Where the output stands in params.grammar. Kept through a preemption: it depends only
    # on the output tokens, which a preempted request keeps.
    grammar: GrammarState | None = field(init=False, default=None)
    # Where the output stands in its thinking, when the model thinks; kept as the grammar is.
    thinking: Thinking | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)
        if self.params.grammar is not None:
            self.grammar = self.params.grammar.matcher()
        if self.params.thinking is not None:
            self.thinking = Thinking(self.params.thinking)
        if self.params.prompt_logprobs is not None:
            self.prompt_logprobs = [None]
        if not self.params.greedy:
            self.generator = torch.Generator()
            if self.params.seed is not None:
                self.generator.manual_seed(self.params.seed)
            else:
                self.generator.seed()

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def forced_token(self) -> int | None:
        """The token the next sample must be: a thinking budget's forced end."""
        return None if self.thinking is None else self.thinking.forced_token

    @property
    def grammar_applies(self) -> bool:
        """Whether the grammar constrains the next token: not inside a thinking span."""
        return self.grammar is not None and (self.thinking is None
                                             or self.thinking.phase is not Phase.INSIDE)

    @property
    def group_id(self) -> str:
        """The id shared by all samples of one prompt (the first sample's)."""
        return self.parent_id or self.request_id

    def fork(self, index: int) -> Request:
        """Sample `index` of this request's prompt: the same prompt and parameters (a seed
        becomes seed + index, as in vLLM), its own id and random generator."""
        seed = self.params.seed
        params = replace(self.params, seed=None if seed is None else (seed + index) % 2**64)
        sample = Request(f"{self.request_id}#{index}", self.prompt_token_ids, params,
                         self.on_output, self.arrival_time, self.priority)
        sample.sample_index, sample.parent_id = index, self.request_id
        sample.prompt_logprobs = None  # the prompt's are the first sample's
        sample.timeout = self.timeout
        return sample

    def prefix_cache_limit(self) -> int:
        """How many leading tokens may come from the prefix cache: all, except while prompt
        logprobs are still owed, whose rows must be computed (cached blocks have no logits)."""
        if self.prompt_logprobs is None or len(self.prompt_logprobs) >= self.num_prompt_tokens:
            return self.num_tokens
        return len(self.prompt_logprobs) - 1

    def append_token(self, token: int, eos_token_ids: Collection[int],
                     logprobs: TokenLogprobs | None = None) -> FinishReason | None:
        """Add one generated token; say whether it ends the request by a stop token or length.

        A stop token (EOS or stop_token_ids) ends the request only once min_tokens tokens came
        before it; it is kept in token_ids but is not part of the text. A finished grammar
        allows only EOS, which then ends the request whatever min_tokens or ignore_eos say.
        The grammar sees no token of a thinking span (engine/thinking.py)."""
        self.token_ids.append(token)
        if logprobs is not None:
            self.cumulative_logprob += logprobs.logprob
        thought = self.thinking is not None and self.thinking.advance(token)
        if self.grammar is not None and not thought and self.grammar.accept(token):
            return FinishReason.STOP
        p = self.params
        if self.num_output_tokens > p.min_tokens and (
                token in p.stop_token_ids or (not p.ignore_eos and token in eos_token_ids)):
            return FinishReason.STOP
        if self.num_output_tokens >= p.max_tokens:
            return FinishReason.LENGTH
        return None

