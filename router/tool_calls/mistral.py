"""The Mistral dialect: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`, and the
newer `[TOOL_CALLS]name[ARGS]{...}`. [TOOL_CALLS] is a special token that the worker's
detokenizer may drop, so an answer that starts with a JSON array is read as calls too."""

from __future__ import annotations

from protocol.tool_dialects import MISTRAL
from router.tool_calls.base import JsonExtent, RawCall, ToolDialect, calls_from_values, json_values

ARGS = "[ARGS]"


class MistralRegion:
    """A region that ends with its JSON value: an array (or object) of calls, or the
    arguments object after `name[ARGS]`."""

    def __init__(self, _marker: str) -> None:
        self._extent = JsonExtent()
        self._args_at: int | None = None  # where the arguments start, in the name[ARGS] form

    def end(self, body: str, final: bool) -> int | None:
        if self._args_at is None:
            end = self._extent.end(body)
            if end is not None or not self._extent.not_json:
                return end
            found = body.find(ARGS)
            if found < 0:
                return None
            self._args_at = found + len(ARGS)
            self._extent = JsonExtent(self._args_at)
        return self._extent.end(body)

    def calls(self, text: str) -> list[RawCall] | None:
        if self._args_at is None:
            return calls_from_values(json_values(text), ("arguments",))
        name = text[: self._args_at - len(ARGS)].strip()
        values = json_values(text[self._args_at :])
        if not name or any(c.isspace() for c in name) or values is None or len(values) != 1:
            return None
        if not isinstance(values[0], dict):
            return None
        return [(name, values[0])]


MISTRAL_DIALECT = ToolDialect(MISTRAL, ("[TOOL_CALLS]",), MistralRegion, opens_at_start="[")
