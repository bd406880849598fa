"""What one step hands from part to part: the scheduler's plan, the runner's output, each
request's update. Everything about a request in a step is keyed by its request id.

    Scheduler.schedule()              -> SchedulerOutput: a ScheduledRequest per request id
    ModelRunner.execute(plan)         -> RunnerOutput: tokens (and logprobs) per request id
    Scheduler.update_from_output(...) -> a RequestUpdate per request that gained tokens or
                                         ended, for the engine's output processing

The runner turns each ScheduledRequest that computes tokens into a SequenceStep, the model's
view of it (tokens, positions, block tables), and runs them all in one batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from engine.logprobs import TokenLogprobs
from engine.request import FinishReason, Request


@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a step: compute num_tokens tokens after its computed ones.

    With speculative decoding, the last of them are drafts (draft_token_ids, not yet in
    request.token_ids) after its last real token. A sample forked this step computes none:
    it samples from the last logits row of the request `fork_of` names."""

    request: Request
    num_tokens: int
    draft_token_ids: list[int] = field(default_factory=list)
    fork_of: str | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def reaches_end(self) -> bool:
        """Whether the step computes the request's last token (a token is then sampled);
        drafts, which come after it, aside."""
        request = self.request
        return (request.num_computed_tokens + self.num_tokens - len(self.draft_token_ids)
                == request.num_tokens)

    def token_ids(self) -> list[int]:
        """The tokens to compute: the request's from its computed count on, then the drafts."""
        start = self.request.num_computed_tokens
        own = self.request.token_ids[start:start + self.num_tokens - len(self.draft_token_ids)]
        return own + self.draft_token_ids if self.draft_token_ids else own


@dataclass
class SchedulerOutput:
    """One step's plan: what each request computes, in batch order, plus what it cost."""

    # Request id -> its share of the step, in batch order (a sample forked this step right
    # after the request it forked from).
    scheduled: dict[str, ScheduledRequest] = field(default_factory=dict)
    preempted: list[Request] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # before the run
    prefix_queried_tokens: int = 0  # prompt tokens looked up in the prefix cache this step
    prefix_hit_tokens: int = 0  # ... and found there

    def add(self, request: Request, num_tokens: int, draft_token_ids: list[int] | None = None,
            fork_of: str | None = None) -> ScheduledRequest:
        """Put a request in the step (once: its id keys everything it gets back)."""
        request_id = request.request_id
        if request_id in self.scheduled:
            raise ValueError(f"request {request_id!r} is already in this step")
        entry = ScheduledRequest(request, num_tokens, draft_token_ids or [], fork_of)
        self.scheduled[request_id] = entry
        return entry

    def requests(self) -> list[Request]:
        return [s.request for s in self.scheduled.values()]

    def drafting(self) -> Iterator[ScheduledRequest]:
        """The requests scheduled with drafts to verify."""
        return (s for s in self.scheduled.values() if s.draft_token_ids)

    def plan(self) -> list[tuple[str, int]]:
        """(request id, tokens to compute) in batch order: for logs and tests."""
        return [(request_id, s.num_tokens) for request_id, s in self.scheduled.items()]

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled.values())

    @property
    def num_prompt_tokens(self) -> int:
        """Tokens of this step that are (re)computed prompt, not decodes."""
        return sum(s.num_tokens for s in self.scheduled.values()
                   if s.request.num_computed_tokens + s.num_tokens <= s.request.num_prompt_tokens)


@dataclass
class RunnerOutput:
    """What the model run gave each request, by request id; a request absent from a dict
    has nothing there (a prompt chunk that stops short of the prompt's end samples nothing).

    sampled_token_ids: its new tokens (several for a request that verified drafts);
    logprobs: one per new token, if asked for; prompt_logprobs: the prompt tokens this step
    scored, if asked for."""

    sampled_token_ids: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)
    prompt_logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)

    def tokens(self, request_id: str) -> list[int]:
        return self.sampled_token_ids.get(request_id, [])


@dataclass
class SequenceStep:
    """One sequence's share of a model run: compute `token_ids`, which sit at positions
    start_pos, start_pos + 1, ...; its block tables (one per KV cache group) already cover
    them."""

    token_ids: list[int]
    start_pos: int
    block_tables: list[list[int]]
    need_logits: bool  # False for a chunk that stops short of the sequence's last token

    @property
    def context_len(self) -> int:
        return self.start_pos + len(self.token_ids)


@dataclass
class RequestUpdate:
    """One request's result of a step: the tokens it gained, and whether they ended it."""

    request: Request
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None  # set by a stop token or by length
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # beside new_token_ids, if asked
    embedding: list[float] | None = None  # an embedding model's vector (it ends the request)

    @property
    def ended_by_stop_token(self) -> bool:
        return self.finish_reason is FinishReason.STOP
