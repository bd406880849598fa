"""One request's state as it moves through the engine, and what a step hands back for it."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from enum import Enum, StrEnum

import torch

from kvcache.kv_cache_manager import SequenceBlocks


class FinishReason(StrEnum):
    STOP = "stop"  # a stop token, EOS or a stop string
    LENGTH = "length"  # max_tokens reached
    ABORT = "abort"  # the client went away
    ERROR = "error"  # the engine failed this request (see RequestOutput.error)


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestOutput:
    """What the engine hands back after a step: new text, and the end when it comes."""

    request_id: str
    text: str
    token_ids: list[int]
    finished: bool = False
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    error: str | None = None


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    on_output: Callable[[RequestOutput], None]  # must be safe to call from the engine thread
    arrival_time: float = field(default_factory=time.monotonic)

    status: Status = Status.WAITING
    token_ids: list[int] = field(init=False)  # prompt, then every generated token
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    num_cached_tokens: int = 0  # prompt tokens taken from the prefix cache when first seated
    blocks: SequenceBlocks = field(default_factory=SequenceBlocks)
    generator: torch.Generator | None = None
    finish_reason: FinishReason | None = None
    scheduled_time: float | None = None  # first seated
    first_token_time: float | None = None
    last_token_time: float | None = None
    num_preemptions: int = 0

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)
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

    def append_token(self, token: int, eos_token_ids: Collection[int]) -> FinishReason | None:
        """Add one generated token; say whether it ends the request by a stop token or length.

        A stop token (EOS or stop_token_ids) ends the request only once min_tokens tokens came
        before it; it is kept in token_ids but is not part of the text."""
        self.token_ids.append(token)
        p = self.params
        if self.num_output_tokens > p.min_tokens and (
                token in p.stop_token_ids or (not p.ignore_eos and token in eos_token_ids)):
            return FinishReason.STOP
        if self.num_output_tokens >= p.max_tokens:
            return FinishReason.LENGTH
        return None


@dataclass
class RequestUpdate:
    """One request's result of a step: the tokens it gained, and whether they ended it."""

    request: Request
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None  # set by a stop token or by length

    @property
    def ended_by_stop_token(self) -> bool:
        return self.finish_reason is FinishReason.STOP
