"""A thinking model's reasoning span, followed token by token, and its budget.

Models such as Qwen3 and DeepSeek-R1's distills write their reasoning between tags before
the answer: `<think>` ... `</think>`. Either the output opens the span itself, or the chat
template opened it at the end of the prompt (`starts_open`). The API says which tags the
model uses, as token ids (api/thinking.py); the engine follows each sample through three
phases, from its tokens alone:

    BEFORE -- the open tag as the first output token --> INSIDE -- the close tag --> AFTER

(output that does not start with the open tag goes straight to AFTER). Tokens between the
tags are counted: usage reports them as reasoning tokens. With a budget, once that many have
come the engine ends the span itself: the next tokens are forced to `forced_ids` (the close
tag and what the template puts after it), then the answer follows.

A grammar (structured output, tool calls) applies to the answer only: it sees no token of
the span, and before the output has started it lets the open tag through, so a thinking
model may think before it answers in the grammar's form. Speculative decoding drafts no
further than the budget's end (`draft_room`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


@dataclass(frozen=True)
class ThinkingParams:
    """How a request's thinking is told apart, and bounded."""

    open_id: int | None  # the open tag, where it is one token (else only a prompt opens it)
    close_ids: list[int]  # the close tag, as the model writes it
    forced_ids: list[int]  # what ends the span when the budget runs out
    starts_open: bool = False  # the prompt ends inside an open span
    budget: int | None = None  # thinking tokens at most; None: unbounded

    def __post_init__(self) -> None:
        if not self.close_ids or not self.forced_ids:
            raise ValueError("the close tag and the forced end need a token each")
        if self.budget is not None and self.budget < 0:
            raise ValueError("a thinking budget cannot be negative")


class Phase(Enum):
    BEFORE = "before"  # no output token yet tells whether the sample thinks
    INSIDE = "inside"
    AFTER = "after"  # the answer (or no thinking at all)


@dataclass
class Thinking:
    """One sample's place in its thinking. Depends only on the output tokens, so a
    preempted request keeps it (as it keeps its grammar's state)."""

    params: ThinkingParams
    phase: Phase = Phase.BEFORE
    tokens: int = 0  # thinking tokens so far (the tags not counted)
    forced: list[int] = field(default_factory=list)  # tokens still to force, in order
    _tail: list[int] = field(default_factory=list)  # the span's last tokens, for the close tag

    def __post_init__(self) -> None:
        if self.params.starts_open:
            self._enter()

    @property
    def forced_token(self) -> int | None:
        """The token the next sample must be (the budget's end), if any."""
        return self.forced[0] if self.forced else None

    @property
    def in_answer(self) -> bool:
        """Whether the next token belongs to the answer (where a grammar applies)."""
        return self.phase is Phase.AFTER

    @property
    def may_open(self) -> int | None:
        """The one-token open tag a grammar must let through as the first output token."""
        return self.params.open_id if self.phase is Phase.BEFORE else None

    def draft_room(self) -> int:
        """How many drafted tokens a speculative step may add (the step's own sampled token
        comes on top) without running past the budget, or into a forced end."""
        if self.forced:
            return 0
        if self.phase is not Phase.INSIDE or self.params.budget is None:
            return 1 << 30
        return max(self.params.budget - self.tokens - 1, 0)

    def advance(self, token: int) -> bool:
        """Take one output token; True when it belongs to the thinking (the tags included),
        which a grammar must not see."""
        if self.phase is Phase.AFTER:
            return False
        if self.phase is Phase.BEFORE:  # the open tag as the first token, or no thinking
            if token != self.params.open_id:
                self.phase = Phase.AFTER
                return False
            self._enter()
            return True
        if self.forced:  # the budget's end, as forced
            self.forced.pop(0)
            if not self.forced:
                self.phase = Phase.AFTER
            return True
        close = self.params.close_ids
        self._tail.append(token)
        del self._tail[:-len(close)]
        if self._tail == close:  # the model closed it: its earlier tokens were counted
            self.tokens -= len(close) - 1
            self.phase = Phase.AFTER
            return True
        self.tokens += 1
        self._check_budget()
        return True

    def _enter(self) -> None:
        self.phase = Phase.INSIDE
        self._check_budget()

    def _check_budget(self) -> None:
        budget = self.params.budget
        if budget is not None and self.tokens >= budget and not self.forced:
            self.forced = list(self.params.forced_ids)
