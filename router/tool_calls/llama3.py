"""The Llama 3.x JSON dialect: `{"name": ..., "parameters": {...}}`, bare at the start of
the answer (what Llama 3.1/3.2 templates ask for) or after `<|python_tag|>`; several calls
are separated by `;`."""

from __future__ import annotations

from protocol.tool_dialects import LLAMA3_JSON
from router.tool_calls.base import JsonCallsRegion, Region, ToolDialect


def _region(_marker: str) -> Region:
    return JsonCallsRegion(("parameters", "arguments"), separators=";")


LLAMA3_DIALECT = ToolDialect(LLAMA3_JSON, ("<|python_tag|>",), _region, opens_at_start="{")
