"""A response's output items, built up from the answer as it comes, and the stream events
that tell each step.

The answer is read into its parts by api/answer.py (the same reading as chat's): a thinking
model's reasoning becomes a reasoning item, the text a message, each tool call a
function_call item, in that order, each opened when its part first comes and done when the
next part starts (or the answer ends). A non-streamed response reads the whole answer once,
so both ways give the same items.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from api.answer import Answer
from api.responses.objects import (
    ArgumentsDeltaEvent,
    ArgumentsDoneEvent,
    ContentPartEvent,
    FunctionCallItem,
    OutputItemEvent,
    OutputMessage,
    OutputText,
    ReasoningDeltaEvent,
    ReasoningDoneEvent,
    ReasoningItem,
    ReasoningText,
    StreamEvent,
    TextDeltaEvent,
    TextDoneEvent,
)
from api.thinking import SplitStream
from api.tools.calls import CallStream
from api.tools.formats import CallFormat

Event = TypeVar("Event", bound=StreamEvent)
Item = ReasoningItem | OutputMessage | FunctionCallItem


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseOutput:
    """One response's output items and the events sent so far (numbered from 0)."""

    def __init__(self, form: CallFormat) -> None:
        self.items: list[Item] = []
        self.done: set[int] = set()  # output indexes whose item is done
        self.parts = SplitStream()
        self.calls = CallStream(form)
        self.call_items: dict[int, int] = {}  # a call's index -> its item's output index
        self.sequence = itertools.count()

    def event(self, cls: type[Event], **fields: Any) -> Event:
        """The next event of the stream."""
        return cls(sequence_number=next(self.sequence), **fields)

    def advance(self, answer: Answer, finished: bool = False,
                incomplete: bool = False) -> list[StreamEvent]:
        """The events that bring the output up to `answer` (the answer so far); once
        `finished`, every item is done (`incomplete`: cut off by the token limit)."""
        reasoning, text = self.parts.deltas(answer.reasoning, answer.content)
        events: list[StreamEvent] = []
        if reasoning:
            events += self._reasoning(reasoning)
        if text:
            events += self._text(text)
        if answer.calls is not None:
            events += self._calls(answer.calls)
        if finished:
            if not self.items:
                events += self._open_message()  # nothing came: an empty message
            for index in range(len(self.items)):
                if index not in self.done:
                    events += self._close(index, "incomplete" if incomplete else "completed")
        return events

    def _open(self, item: Item) -> list[StreamEvent]:
        """The events that close the item before (if still open) and open `item`."""
        events: list[StreamEvent] = []
        if self.items and len(self.items) - 1 not in self.done:
            events += self._close(len(self.items) - 1, "completed")
        self.items.append(item)
        shown = item.model_copy(update={"content": []} if not isinstance(
            item, FunctionCallItem) else {})
        events.append(self.event(OutputItemEvent, type="response.output_item.added",
                                 output_index=len(self.items) - 1, item=shown))
        return events

    def _latest(self, kind: type[Item]) -> int | None:
        """The output index of the last item if it is open and of `kind`."""
        index = len(self.items) - 1
        if index < 0 or index in self.done or not isinstance(self.items[index], kind):
            return None
        return index

    def _reasoning(self, delta: str) -> list[StreamEvent]:
        return self._grow(ReasoningItem, lambda: self._open(ReasoningItem(
            id=item_id("rs"), status="in_progress", content=[ReasoningText(text="")])),
            ReasoningDeltaEvent, delta)

    def _open_message(self) -> list[StreamEvent]:
        message = OutputMessage(id=item_id("msg"), status="in_progress",
                                content=[OutputText(text="")])
        events = self._open(message)
        events.append(self.event(ContentPartEvent, type="response.content_part.added",
                                 item_id=message.id, output_index=len(self.items) - 1,
                                 content_index=0, part=OutputText(text="")))
        return events

    def _text(self, delta: str) -> list[StreamEvent]:
        return self._grow(OutputMessage, self._open_message, TextDeltaEvent, delta)

    def _grow(self, kind: type[Item], opening: Callable[[], list[StreamEvent]],
              told_by: type[StreamEvent], delta: str) -> list[StreamEvent]:
        """`delta` added to the open item of `kind` (opened first, unless the last item is
        one), and the event that tells it."""
        events = [] if self._latest(kind) is not None else opening()
        index = len(self.items) - 1
        item = self.items[index]
        item.content[0].text += delta  # type: ignore[union-attr]
        events.append(self.event(told_by, item_id=item.id, output_index=index,
                                 content_index=0, delta=delta))
        return events

    def _calls(self, text: str) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        for entry in self.calls.deltas(text):
            if "id" in entry:  # a call's name has come: its item opens
                call = FunctionCallItem(id=item_id("fc"), call_id=entry["id"],
                                        name=entry["function"]["name"], arguments="",
                                        status="in_progress")
                events += self._open(call)
                self.call_items[entry["index"]] = len(self.items) - 1
                continue
            index = self.call_items[entry["index"]]
            call = self.items[index]  # type: ignore[assignment]
            piece = entry["function"]["arguments"]
            call.arguments += piece
            events.append(self.event(ArgumentsDeltaEvent, item_id=call.id, output_index=index,
                                     delta=piece))
        for number, scanned in enumerate(self.calls.scanned(text)):
            index = self.call_items.get(number)
            if scanned.complete and index is not None and index not in self.done:
                events += self._close(index, "completed")
        return events

    def _close(self, index: int, status: Literal["completed", "incomplete"]) -> list[StreamEvent]:
        """The events that end item `index`."""
        self.done.add(index)
        item = self.items[index]
        item.status = status
        events: list[StreamEvent] = []
        if isinstance(item, FunctionCallItem):
            events.append(self.event(ArgumentsDoneEvent, item_id=item.id, output_index=index,
                                     name=item.name, arguments=item.arguments))
        elif isinstance(item, ReasoningItem):
            events.append(self.event(ReasoningDoneEvent, item_id=item.id, output_index=index,
                                     content_index=0, text=item.content[0].text))
        else:
            part = item.content[0]
            events += [self.event(TextDoneEvent, item_id=item.id, output_index=index,
                                  content_index=0, text=part.text),
                       self.event(ContentPartEvent, type="response.content_part.done",
                                  item_id=item.id, output_index=index, content_index=0,
                                  part=part.model_copy())]
        events.append(self.event(OutputItemEvent, type="response.output_item.done",
                                 output_index=index, item=item.model_copy(deep=True)))
        return events
