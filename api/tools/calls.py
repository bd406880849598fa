"""Reading tool calls back out of an answer the call grammar (api/tools/plan.py) produced.

The grammar fixes every character outside the names and the arguments (in the model's
format: api/tools/formats.py), so the calls are read by walking that structure, not
searched: `scan` takes the calls' text so far (complete or still streaming) and returns each
call's name and as much of its arguments as has come.
The arguments' end is found by counting brackets outside JSON strings, so a streamed piece
never has to be taken back: the pieces join into exactly the final arguments.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from api.tools.formats import GENERIC, CallFormat


@dataclass
class ScannedCall:
    name: str | None = None  # None until the whole name has come
    arguments: str = ""  # the arguments' JSON text so far
    complete: bool = False  # its closing tag has come


@dataclass
class Scan:
    calls: list[ScannedCall] = field(default_factory=list)
    valid: bool = True  # the text so far is a prefix of calls in the grammar's format

    @property
    def complete(self) -> bool:
        """The text is whole calls (and nothing else)."""
        return self.valid and bool(self.calls) and all(c.complete for c in self.calls)


def _expect(text: str, pos: int, literal: str) -> int | None:
    """The position after `literal` at `pos`; -1 when the text ends inside it; None when
    the text differs from it."""
    rest = text[pos:pos + len(literal)]
    if rest == literal:
        return pos + len(literal)
    return -1 if literal.startswith(rest) else None


def json_value_end(text: str, start: int) -> int | None:
    """The end of the JSON object or array starting at `start`, None if it has not ended."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def scan(text: str, form: CallFormat = GENERIC) -> Scan:
    """The calls in `text`, which should be calls in `form`, maybe cut off."""
    result, pos = Scan(), 0
    if form.prefix:  # it may come once, before the first call
        after = _expect(text, 0, form.prefix)
        if after == -1:
            return result
        pos = after or 0
    while pos < len(text):
        if result.calls:
            after = _expect(text, pos, form.separator)
            if after is None or after == -1:
                result.valid = after == -1
                return result
            pos = after
        call = ScannedCall()
        after = _expect(text, pos, form.opening)
        if after is None:
            result.valid = False
            return result
        result.calls.append(call)
        if after == -1:
            return result
        end = text.find('"', after + 1)  # names are [A-Za-z0-9_-]: no escapes inside
        if not text.startswith('"', after) or end == -1:
            result.valid = text.startswith('"', after) or after == len(text)
            return result
        call.name = json.loads(text[after:end + 1])
        after = _expect(text, end + 1, form.before_arguments)
        if after is None or after == -1:
            result.valid = after == -1
            return result
        args_end = json_value_end(text, after)
        call.arguments = text[after:args_end]
        if args_end is None:
            return result
        after = _expect(text, args_end, form.ending)
        if after is None or after == -1:
            result.valid = after == -1
            return result
        call.complete, pos = True, after
    return result


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class CallStream:
    """One streamed choice's tool calls: what has been sent of each so far."""

    form: CallFormat = GENERIC
    ids: list[str] = field(default_factory=list)
    sent_arguments: list[int] = field(default_factory=list)  # characters sent, per call

    def scanned(self, text: str) -> list[ScannedCall]:
        """The calls in `text` (all of the calls' text so far)."""
        return scan(text, self.form).calls

    def deltas(self, text: str) -> list[dict]:
        """The delta.tool_calls entries that bring the client up to `text` (all of the calls'
        text so far): a call's index, id, type and name first, then its arguments in pieces."""
        entries: list[dict] = []
        for index, call in enumerate(scan(text, self.form).calls):
            if call.name is None:
                break
            if index == len(self.ids):
                self.ids.append(new_call_id())
                self.sent_arguments.append(0)
                entries.append({"index": index, "id": self.ids[index], "type": "function",
                                "function": {"name": call.name, "arguments": ""}})
            piece = call.arguments[self.sent_arguments[index]:]
            if piece:
                self.sent_arguments[index] = len(call.arguments)
                entries.append({"index": index, "function": {"arguments": piece}})
        return entries
