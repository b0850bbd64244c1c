"""What a tool-call dialect tells the streaming parser: which markers open a call region,
where a region ends, and which calls it holds.

A region is the stretch of answer text one dialect's call markup covers (`<tool_call>...
</tool_call>`, `[TOOL_CALLS][...]`, a bare JSON object). The parser finds where regions
start; a `Region` says where its own ends and what calls it holds, or that it holds none
that are well formed (then the parser returns its text as text).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

RawCall = tuple[str, dict[str, Any]]  # a function name and its arguments object


class Region(Protocol):
    """One call region being read; may remember how far it scanned, since its body only
    grows between calls."""

    def end(self, body: str, final: bool) -> int | None:
        """Where the region ends in `body` (the text after its marker), exclusive; None
        while that is not known yet (`final`: no more text will come); 0 when the body
        shows that this is no call at all (the marker is then text, with no log line)."""

    def calls(self, text: str) -> list[RawCall] | None:
        """The calls in the region's text (`body[:end]`), or None if it is malformed."""


@dataclass(frozen=True)
class ToolDialect:
    """A tool-call format: `markers` open a region anywhere in the answer, `start_markers`
    only where the answer (or the run of calls it began with) starts; a first non-space
    character there in `opens_at_start` opens a marker-less region (Llama's bare JSON, and
    Mistral's array when the detokenizer drops the special [TOOL_CALLS] token).
    `region(marker)` reads one region ("" marker: bare). `text_forms` are the markers
    ("" too) whose regions hold calls written as text, not in the dialect's own markup:
    read only where the request allows that, and held to the tools' schemas
    (`router.tool_calls.written_calls`)."""

    name: str
    markers: tuple[str, ...]
    region: Callable[[str], Region]
    opens_at_start: str = ""
    start_markers: tuple[str, ...] = ()
    text_forms: tuple[str, ...] = ()


def call_from_object(value: Any, argument_keys: tuple[str, ...] = ("arguments", "parameters")) -> RawCall | None:
    """A call from `{"name": ..., "arguments": {...}}` (or OpenAI's nesting under
    "function"), or None if it is not one. Arguments may be an object or a JSON
    object's text; absent arguments are an empty object."""
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("function"), dict) and "name" not in value:
        value = value["function"]
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return None
    arguments: Any = {}
    for key in argument_keys:
        if key in value:
            arguments = value[key]
            break
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return name, arguments


def json_values(text: str, separators: str = "") -> list[Any] | None:
    """Every JSON value in `text`, separated by whitespace (and any of `separators`);
    None if anything else is there or there is none."""
    decoder = json.JSONDecoder()
    values = []
    position, skip = 0, " \t\r\n" + separators
    while True:
        while position < len(text) and text[position] in skip:
            position += 1
        if position == len(text):
            return values or None
        try:
            value, position = decoder.raw_decode(text, position)
        except ValueError:
            return None
        values.append(value)


def call_values(text: str, separators: str = "") -> list[Any] | None:
    """`json_values` of a call region, also when the model doubled the object's braces
    (`{{"name": ..., "arguments": {...}}}`): Qwen2.5's template shows the call format as
    `{{"name": <function-name>, ...}}`, and its Coder models copy that literally."""
    values = json_values(text, separators)
    if values is None:
        stripped = text.strip(" \t\r\n")
        if stripped.startswith("{{") and stripped.endswith("}}"):
            values = json_values(stripped[1:-1], separators)
    return values


def calls_from_values(values: list[Any] | None, argument_keys: tuple[str, ...] = ("arguments", "parameters")
                      ) -> list[RawCall] | None:
    """The calls in parsed JSON values (each an object, or an array of them); None if any
    is not a call."""
    if values is None:
        return None
    calls = []
    for value in values:
        for item in value if isinstance(value, list) else [value]:
            call = call_from_object(item, argument_keys)
            if call is None:
                return None
            calls.append(call)
    return calls or None


class JsonExtent:
    """Where one JSON object or array ends, in text that arrives in pieces.

    Scans each character once however often it is asked (a long call's body would be
    rescanned at every token otherwise). Invariant: `position` characters are scanned and
    `depth`, `in_string`, `escaped` describe the state after them.
    """

    def __init__(self, start: int = 0) -> None:
        """Scan from index `start` of the text (the value's own start, or space before it)."""
        self.position = start
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.started = False
        self.not_json = False  # the first non-space character opens no object or array
        self.closed_at: int | None = None

    def end(self, text: str) -> int | None:
        """The index just after the value's closing bracket, or None if it is not closed
        yet (or never will be: `not_json`)."""
        if self.closed_at is not None:
            return self.closed_at
        while self.position < len(text) and not self.not_json:
            char = text[self.position]
            self.position += 1
            if not self.started:
                if char in " \t\r\n":
                    continue
                if char not in "{[":
                    self.not_json = True
                    return None
                self.started = True
                self.depth = 1
            elif self.in_string:
                if self.escaped:
                    self.escaped = False
                elif char == "\\":
                    self.escaped = True
                elif char == '"':
                    self.in_string = False
            elif char == '"':
                self.in_string = True
            elif char in "{[":
                self.depth += 1
            elif char in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.closed_at = self.position
                    return self.position
        return None


class JsonCallsRegion:
    """A region of one JSON call object, or of several joined by any of `separators`
    (Llama's `;`): it ends after a value that no separator follows, or, when it holds no
    JSON at all (a built-in tool's Python call after Llama's <|python_tag|>), with the
    answer."""

    def __init__(self, argument_keys: tuple[str, ...], separators: str = "") -> None:
        self._argument_keys = argument_keys
        self._separators = separators
        self._extent = JsonExtent()

    def end(self, body: str, final: bool) -> int | None:
        while True:
            value_end = self._extent.end(body)
            if value_end is None:
                return len(body) if final and self._extent.not_json else None
            if not self._separators:
                return value_end
            rest = value_end
            while rest < len(body) and body[rest] in " \t\r\n":
                rest += 1
            if rest == len(body):
                return len(body) if final else None  # a separator and another call may follow
            if body[rest] not in self._separators:
                return value_end
            self._extent = JsonExtent(rest + 1)

    def calls(self, text: str) -> list[RawCall] | None:
        return calls_from_values(call_values(text, self._separators), self._argument_keys)
