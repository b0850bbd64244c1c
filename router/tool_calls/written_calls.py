"""Calls written as text: an answer that is nothing but one call in a form the model's
dialect does not use. Small models write them: Qwen2.5-Coder-1.5B under Claude Code
answered `# Read` and then `{"file_path": ..., "offset": 0}`; the 0.5B writes
`{"name": ..., "arguments": {...}}` bare, or in a ```json block.

A `WrittenCallRegion` opens where the answer starts and reads to its end: a tool's name
(after `#` heading marks, in backticks, before a colon) then its arguments object, or a
call object with no name before it; either bare or in a ```json block. It gives up (the
text streams on) as soon as the text can no longer be one: prose is held back only while
it may still be a tool's name. Whether the call counts (its arguments valid against the
tool's schema) is the parser's judgement, `ToolCallParser`.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from router.tool_calls.base import JsonExtent, RawCall, call_from_object, json_values

FENCE = "```"
_FENCE_OPEN = re.compile(r"```(?:json)?\s*")  # a code block's opening line, before the object
_HEADING = re.compile(r"(?:#{1,6}[ \t]*)?")
_NAME = re.compile(r"[\w.\-]*")
_AFTER_NAME = re.compile(r"[ \t]*:?\s*")
_SPACE = " \t\r\n"

Head = tuple[str | None, bool]  # (the tool's name written before the JSON, or None; in a code block)


class WrittenCallRegion:
    """An answer that may be one call written as text (the `Region` protocol).

    `objects`: a call object with no name before it is read here (the dialect does not
    read one itself); `fenced`: so is one in a code block. After `calls`, `named_in_text`
    says whether the name came from the text before the JSON (the looser form, held to a
    stricter check by the parser).
    """

    def __init__(self, names: Collection[str], *, objects: bool, fenced: bool) -> None:
        self._names = names
        self._objects = objects
        self._fenced = fenced
        self._head: Head | None = None
        self._extent: JsonExtent | None = None
        self.named_in_text = False

    def end(self, body: str, final: bool) -> int | None:
        if self._extent is None:
            brace = body.find("{")
            head = self.read_head(body if brace < 0 else body[:brace], complete=brace >= 0)
            if head is None or brace < 0:
                return None if head is not None and not final else 0  # a head so far: wait
            self._head, self._extent = head, JsonExtent(brace)
        value_end = self._extent.end(body)
        if value_end is None:
            return 0 if final else None
        tail = body[value_end:]
        if self._head is not None and self._head[1]:  # the code block must close
            stripped = tail.lstrip(_SPACE)
            if not stripped.startswith(FENCE):
                return None if not final and FENCE.startswith(stripped) else 0
            tail = stripped[len(FENCE):]
        if tail.strip(_SPACE):
            return 0  # more text after it: the answer is not only a call
        return len(body) if final else None

    def read_head(self, head: str, complete: bool) -> Head | None:
        """What comes before the JSON: (name, fenced) if `head` is a whole one (`complete`:
        the JSON starts right after it) or may still become one; None if it cannot."""
        for name_first in (True, False):
            found = self._read(head, complete, name_first)
            if found is not None:
                return found
        return None

    def _read(self, head: str, complete: bool, name_first: bool) -> Head | None:
        name: str | None = None
        rest = head
        if name_first:
            rest = rest[_HEADING.match(rest).end():]  # type: ignore[union-attr]
            tick = rest.startswith("`") and not rest.startswith(FENCE[:2])
            rest = rest[tick:]
            word = _NAME.match(rest).group()  # type: ignore[union-attr]
            rest = rest[len(word):]
            if not rest and not complete:
                return (word, False) if any(n.startswith(word) for n in self._names) else None
            if word not in self._names:
                return None
            if tick:
                if not rest.startswith("`"):
                    return None if complete or rest else (word, False)
                rest = rest[1:]
            name = word
            rest = rest[_AFTER_NAME.match(rest).end():]  # type: ignore[union-attr]
        elif not (self._objects or self._fenced):
            return None
        if not rest:
            return (name, False) if name is not None or self._objects or not complete else None
        if _FENCE_OPEN.fullmatch(rest):
            return (name, True) if name is not None or self._fenced else None
        if not complete and (FENCE + "json").startswith(rest) and (name is not None or self._fenced):
            return (name, True)
        return None

    def calls(self, text: str) -> list[RawCall] | None:
        assert self._head is not None
        name, fenced = self._head
        inner = text[text.find("{"):].rstrip(_SPACE)
        values = json_values(inner.removesuffix(FENCE) if fenced else inner)
        if values is None or len(values) != 1 or not isinstance(values[0], dict):
            return None
        self.named_in_text = name is not None
        if name is not None:
            return [(name, values[0])]
        call = call_from_object(values[0])
        return [call] if call is not None else None
