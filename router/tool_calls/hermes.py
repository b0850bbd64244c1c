"""The Hermes dialect (Qwen2.5, Qwen3, Hermes models) and mlxd's fallback, which uses the
same markup: each call is `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.

Small models also write the call object bare, without the tags, or in a ```json code
block (Qwen2.5-Coder-0.5B does both, greedily): an answer that starts with a JSON object
or such a block is read as calls too, as llama.cpp's Hermes parser does. Those are calls
written as text (`ToolDialect.text_forms`): read only when the request allows it, and
only if each object names an offered function whose schema its arguments satisfy;
anything else stays text.
"""

from __future__ import annotations

from protocol.tool_dialects import CALL_CLOSE, CALL_OPEN, HERMES, MLXD
from router.tool_calls.base import (
    JsonCallsRegion,
    JsonExtent,
    RawCall,
    Region,
    ToolDialect,
    call_values,
    calls_from_values,
)


class TaggedRegion:
    """A region that ends at the closing tag; inside, one or more call objects."""

    def __init__(self, _marker: str) -> None:
        self._searched = 0  # the closing tag does not start before this index

    def end(self, body: str, final: bool) -> int | None:
        found = body.find(CALL_CLOSE, self._searched)
        if found < 0:
            self._searched = max(0, len(body) - len(CALL_CLOSE) + 1)
            return None
        return found + len(CALL_CLOSE)

    def calls(self, text: str) -> list[RawCall] | None:
        return calls_from_values(call_values(text[: -len(CALL_CLOSE)]))


FENCE = "```"


class FencedRegion:
    """A call object in a Markdown code block (```json ... ```), which small models write
    too. The region gives up at once (end 0) when the block turns out to hold anything
    but one JSON value, so a code answer streams as it comes."""

    def __init__(self, _marker: str) -> None:
        self._extent: JsonExtent | None = None

    def end(self, body: str, final: bool) -> int | None:
        if self._extent is None:
            rest = body.removeprefix("json")
            if "json".startswith(rest) and rest == body:  # "", "j", "js", "jso": may still be "json"
                return 0 if final else None
            value = rest.lstrip(" \t\r\n")
            if not value:
                return 0 if final else None
            if value[0] != "{":
                return 0
            self._extent = JsonExtent(len(body) - len(value))
        value_end = self._extent.end(body)
        if value_end is None:
            return None
        tail = body[value_end:].lstrip(" \t\r\n")
        if tail.startswith(FENCE):
            return len(body) - len(tail) + len(FENCE)
        return None if FENCE.startswith(tail) else 0  # "" or "`", "``": the fence may still close

    def calls(self, text: str) -> list[RawCall] | None:
        inner = text[: -len(FENCE)]
        return calls_from_values(call_values(inner.removeprefix("json")))


def _region(marker: str) -> Region:
    if marker == FENCE:
        return FencedRegion(marker)
    return TaggedRegion(marker) if marker else JsonCallsRegion(("arguments", "parameters"))


HERMES_DIALECT = ToolDialect(HERMES, (CALL_OPEN,), _region, opens_at_start="{", start_markers=(FENCE,),
                             text_forms=("", FENCE))
MLXD_DIALECT = ToolDialect(MLXD, (CALL_OPEN,), _region, opens_at_start="{", start_markers=(FENCE,),
                             text_forms=("", FENCE))
