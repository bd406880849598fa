"""A response's output items, built up from the answer's text as it comes, and the stream
events that tell each step.

Under tools that may be called, the answer is function calls if it starts like one (the call
grammar of api/tools/plan.py lets free text start with anything but "<"), read by
api/tools/calls.py as it grows; otherwise it is one message. A non-streamed response walks
the whole text once, so both ways give the same items.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any, Literal, TypeVar

from api.responses.objects import (
    ArgumentsDeltaEvent,
    ArgumentsDoneEvent,
    ContentPartEvent,
    FunctionCallItem,
    OutputItemEvent,
    OutputMessage,
    OutputText,
    StreamEvent,
    TextDeltaEvent,
    TextDoneEvent,
)
from api.tools.calls import CallStream, is_call_text, scan

Event = TypeVar("Event", bound=StreamEvent)
Mode = Literal["text", "calls"]


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseOutput:
    """One response's output items and the events sent so far (numbered from 0)."""

    def __init__(self, may_call: bool) -> None:
        self.may_call = may_call
        self.items: list[OutputMessage | FunctionCallItem] = []
        self.done: set[int] = set()  # output indexes whose item is done
        self.calls = CallStream()
        self.sequence = itertools.count()

    def event(self, cls: type[Event], **fields: Any) -> Event:
        """The next event of the stream."""
        return cls(sequence_number=next(self.sequence), **fields)

    def mode(self, text: str) -> Mode | None:
        """Whether the answer is text or calls; None while it cannot be told yet."""
        if not self.may_call:
            return "text"
        is_calls = is_call_text(text)
        return None if is_calls is None else "calls" if is_calls else "text"

    def advance(self, text: str, finished: bool = False,
                incomplete: bool = False) -> list[StreamEvent]:
        """The events that bring the output up to `text` (the whole answer so far); once
        `finished`, every item is done (`incomplete`: cut off by the token limit)."""
        mode = self.mode(text)
        events = self._calls(text) if mode == "calls" else (
            self._text(text) if mode == "text" else [])
        if finished:
            if mode != "calls" and not self.items:
                events += self._open_message()  # nothing came: an empty message
            for index in range(len(self.items)):
                if index not in self.done:
                    events += self._close(index, "incomplete" if incomplete else "completed")
        return events

    def _open_message(self) -> list[StreamEvent]:
        message = OutputMessage(id=item_id("msg"), status="in_progress", content=[])
        self.items.append(message)
        part = OutputText(text="")
        message.content.append(part)
        return [self.event(OutputItemEvent, type="response.output_item.added", output_index=0,
                           item=message.model_copy(update={"content": []})),
                self.event(ContentPartEvent, type="response.content_part.added",
                           item_id=message.id, output_index=0, content_index=0,
                           part=part.model_copy())]

    def _text(self, text: str) -> list[StreamEvent]:
        events = [] if self.items else self._open_message()
        part = self.items[0].content[0]  # type: ignore[union-attr]
        delta = text[len(part.text):]
        if delta:
            part.text = text
            events.append(self.event(TextDeltaEvent, item_id=self.items[0].id, output_index=0,
                                     content_index=0, delta=delta))
        return events

    def _calls(self, text: str) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        for entry in self.calls.deltas(text):
            index = entry["index"]
            if "id" in entry:  # a call's name has come: its item opens
                call = FunctionCallItem(id=item_id("fc"), call_id=entry["id"],
                                        name=entry["function"]["name"], arguments="",
                                        status="in_progress")
                self.items.append(call)
                events.append(self.event(OutputItemEvent, type="response.output_item.added",
                                         output_index=index, item=call.model_copy()))
                continue
            call = self.items[index]  # type: ignore[assignment]
            piece = entry["function"]["arguments"]
            call.arguments += piece
            events.append(self.event(ArgumentsDeltaEvent, item_id=call.id, output_index=index,
                                     delta=piece))
        for index, scanned in enumerate(scan(text).calls[:len(self.items)]):
            if scanned.complete and index not in self.done:
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
