"""The streaming core: answer text in, in pieces of any size; text and tool-call events out.

Every API answers from the same parser, fed token deltas while streaming and the whole
text at once otherwise, so the two modes cannot disagree: for any way of cutting the text,
the events add up to the same content and calls.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import uuid
from collections.abc import Callable, Collection

from router.tool_calls.base import RawCall, Region, ToolDialect
from router.tool_calls.events import ArgumentsDelta, CallEnd, CallStart, Event, TextDelta
from router.tool_calls.request import ToolSpec
from router.tool_calls.schemas import ToolSchemas
from router.tool_calls.written_calls import FENCE, WrittenCallRegion

logger = logging.getLogger(__name__)


def new_call_id() -> str:
    """A call id in OpenAI's style."""
    return f"call_{uuid.uuid4().hex[:24]}"


def request_call_ids(request_id: str) -> Callable[[], str]:
    """The call ids of one answer, in OpenAI's style: derived from its request id and the
    call's place, so that parsing the same answer again names its calls the same way
    (`router.call_memory` does, to know a call when the client sends it back)."""
    counter = itertools.count()

    def make_id() -> str:
        digest = hashlib.blake2b(f"{request_id}\x00{next(counter)}".encode(), digest_size=12).hexdigest()
        return f"call_{digest}"

    return make_id


class ToolCallParser:
    """Splits one answer into text and tool calls in the model's dialect.

    Invariants: no text that could still begin a call marker is emitted (a possible
    marker prefix at the end of what arrived is held back, so markup never leaks when a
    marker is split across tokens); a call is emitted only once its region is complete
    and well formed (so a call never has to be taken back); a region that is malformed,
    names a function not offered, or is still open when the answer ends is emitted as
    the text it was, with a log line. Whitespace before a call, between calls and at the
    end of an answer with calls is layout, not content, and dropped (an answer without
    calls keeps every character).

    Calls written as text (the dialect's `text_forms`, and an answer that is only one
    call in another form, `WrittenCallRegion`) are read only with `text_calls`, and
    count only if each call's arguments satisfy its tool's schema; a call whose name came
    from the text before its JSON (`# Read` then the arguments) only if they satisfy
    exactly that one tool's schema, no other's.
    """

    def __init__(self, dialect: ToolDialect, tool_names: Collection[str], *, max_calls: int | None = None,
                 label: str = "", make_id: Callable[[], str] = new_call_id, text_calls: bool = True,
                 schemas: ToolSchemas | None = None) -> None:
        """`max_calls`: calls beyond it are dropped (`parallel_tool_calls: false` is 1);
        `label` names the request in log lines; `schemas`: the tools' parameters (None:
        each tool takes any object)."""
        self._dialect = dialect
        self._names = frozenset(tool_names)
        self._max_calls = max_calls
        self._label = label
        self._make_id = make_id
        self._schemas = schemas if schemas is not None else ToolSchemas([ToolSpec(name) for name in tool_names])
        self._text_calls = text_calls
        forms = () if text_calls else dialect.text_forms
        self._opens_at_start = "" if "" in forms else dialect.opens_at_start
        self._start_markers = tuple(m for m in dialect.start_markers if m not in forms)
        self._buffer = ""  # text received and not yet emitted or decided
        # where a bare or start-marked call may begin: the answer's start, or after such calls
        self._at_start = bool(self._opens_at_start or self._start_markers or text_calls)
        self._fresh = True  # nothing decided yet: the whole answer may be a call written as text
        self._marker = ""  # the marker of the open region
        self._region: Region | None = None
        self._space = ""  # whitespace held back: dropped if a call follows
        self.num_calls = 0
        self.num_recovered = 0  # of them, calls written as text
        self.calls: list[RawCall] = []  # the answer's calls so far, each (name, arguments)

    def feed(self, text: str) -> list[Event]:
        """The events that `text`, the next piece of the answer, settles."""
        self._buffer += text
        return self._drain(final=False)

    def finish(self) -> list[Event]:
        """The events still held when the answer ends (held text, an unclosed call)."""
        events = self._drain(final=True)
        if self._space and not self.num_calls:
            events.append(TextDelta(self._space))
        self._space = ""
        return events

    def _drain(self, final: bool) -> list[Event]:
        events: list[Event] = []
        while True:
            if self._region is not None:
                end = self._region.end(self._buffer, final)
                if end is None and not final:
                    return events
                if end is None:
                    self._reject(events, self._marker + self._buffer, "is not closed when the answer ends")
                    self._buffer = ""
                    continue
                text, self._buffer = self._buffer[:end], self._buffer[end:]
                self._close_region(events, text)
                continue
            if self._at_start:
                body = self._buffer.lstrip()
                markers = self._dialect.markers + self._start_markers
                if not final and any(m.startswith(body) for m in markers):  # also an empty body: all space so far
                    return events
                self._at_start, fresh, self._fresh = False, self._fresh, False
                space = self._buffer[: len(self._buffer) - len(body)]
                start = next((m for m in self._start_markers if body.startswith(m)), None)
                if start is not None:
                    self._text(events, space)
                    self._open(start, body[len(start) :])
                    continue
                if body and body[0] in self._opens_at_start and not any(map(body.startswith, markers)):
                    self._text(events, space)
                    self._open("", body)
                    continue
                if body and fresh and self._text_calls:
                    self._text(events, space)
                    self._open("", body)
                    self._region = WrittenCallRegion(self._names, objects="{" not in self._opens_at_start,
                                                     fenced=FENCE not in self._start_markers)
                    continue
            found = self._find_marker()
            if found is not None:
                at, marker = found
                self._text(events, self._buffer[:at])
                self._open(marker, self._buffer[at + len(marker) :])
                continue
            keep = 0 if final else self._marker_prefix_length()
            self._text(events, self._buffer[: len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep :]
            return events

    def _find_marker(self) -> tuple[int, str] | None:
        found = None
        for marker in self._dialect.markers:
            at = self._buffer.find(marker)
            if at >= 0 and (found is None or at < found[0]):
                found = (at, marker)
        return found

    def _marker_prefix_length(self) -> int:
        """Length of the longest end of the buffer that a marker starts with."""
        best = 0
        for marker in self._dialect.markers:
            for n in range(min(len(marker) - 1, len(self._buffer)), best, -1):
                if self._buffer.endswith(marker[:n]):
                    best = n
                    break
        return best

    def _open(self, marker: str, body: str) -> None:
        self._marker, self._region, self._buffer = marker, self._dialect.region(marker), body

    def _text(self, events: list[Event], text: str) -> None:
        if not text:
            return
        text = self._space + text
        body = text.rstrip()
        self._space = text[len(body) :]
        if body:
            events.append(TextDelta(body))

    def _close_region(self, events: list[Event], text: str) -> None:
        assert self._region is not None
        raw = self._marker + text
        if not text:  # the region saw at once that it holds no call (a code block, not JSON)
            self._region = None
            self._text(events, raw)
            return
        region = self._region
        calls = region.calls(text)
        self._region = None
        if calls is None:
            self._reject(events, raw, "is not a well-formed tool call")
            return
        unknown = sorted({name for name, _ in calls if name not in self._names})
        if unknown:
            self._reject(events, raw, f"calls {', '.join(map(repr, unknown))}, which the request does not offer")
            return
        written = isinstance(region, WrittenCallRegion) or self._marker in self._dialect.text_forms
        if written:
            why = self._refusal(calls, isinstance(region, WrittenCallRegion) and region.named_in_text)
            if why is not None:
                self._reject(events, raw, f"is a call written as text that {why}")
                return
        self._space = ""
        # after bare calls, another bare call may follow (one region per call, so that a
        # call cut short at the end costs only itself)
        self._at_start = self._marker == "" or self._marker in self._dialect.start_markers
        for name, arguments in calls:
            if self._max_calls is not None and self.num_calls >= self._max_calls:
                logger.info("%s: dropped a call to %r: parallel_tool_calls is false", self._label, name)
                continue
            index, self.num_calls = self.num_calls, self.num_calls + 1
            self.calls.append((name, arguments))
            if written:
                self.num_recovered += 1
                logger.info("%s: read a call to %r written as text", self._label, name)
            events.append(CallStart(index, self._make_id(), name))
            events.append(ArgumentsDelta(index, json.dumps(arguments, ensure_ascii=False)))
            events.append(CallEnd(index))

    def _refusal(self, calls: list[RawCall], named_in_text: bool) -> str | None:
        """Why calls written as text are not calls (None: they are)."""
        for name, arguments in calls:
            if not self._schemas.accepts(name, arguments):
                return f"does not satisfy {name!r}'s parameters"
            if named_in_text:
                others = [other for other in self._schemas.matching(arguments) if other != name]
                if others:
                    return f"satisfies the parameters of {', '.join(map(repr, others))} as well as {name!r}'s"
        return None

    def _reject(self, events: list[Event], raw: str, why: str) -> None:
        """A region that is no call goes out as the text it was."""
        self._region = None
        logger.info("%s: %s markup %s; returned as text: %.200r", self._label, self._dialect.name, why, raw)
        self._text(events, raw)
