"""Tool calls in model answers, for every API: the streaming parser (text deltas in,
dialect-neutral events out), one module per dialect, and the grammar that forces a call.
"""

from __future__ import annotations

import logging

from protocol.tool_dialects import MLXD
from router.tool_calls.base import ToolDialect
from router.tool_calls.events import ArgumentsDelta, CallEnd, CallStart, Event, TextDelta, ToolCall, gather
from router.tool_calls.grammar import forced_call_grammar
from router.tool_calls.hermes import HERMES_DIALECT, MLXD_DIALECT
from router.tool_calls.llama3 import LLAMA3_DIALECT
from router.tool_calls.mistral import MISTRAL_DIALECT
from router.tool_calls.parser import ToolCallParser, new_call_id, request_call_ids
from router.tool_calls.request import AUTO, FUNCTION, NONE, REQUIRED, ToolRequest, ToolSpec
from router.tool_calls.schemas import ToolSchemas

__all__ = [
    "AUTO", "FUNCTION", "NONE", "REQUIRED", "ArgumentsDelta", "CallEnd", "CallStart", "Event", "TextDelta", "ToolCall",
    "ToolCallParser", "ToolDialect", "ToolRequest", "ToolSpec", "dialect_named", "forced_call_grammar", "gather",
    "make_parser",
]

logger = logging.getLogger(__name__)

DIALECTS = {d.name: d for d in (HERMES_DIALECT, LLAMA3_DIALECT, MISTRAL_DIALECT, MLXD_DIALECT)}


def dialect_named(name: str) -> ToolDialect:
    """The dialect a worker reported; an unknown name (a newer worker) reads as mlxd's
    fallback, whose markup is the most common one."""
    dialect = DIALECTS.get(name)
    if dialect is None:
        logger.warning("unknown tool dialect %r; parsing tool calls as %r", name, MLXD)
        return DIALECTS[MLXD]
    return dialect


def make_parser(request: ToolRequest, dialect: str, label: str = "") -> ToolCallParser:
    """The parser for one answer to `request` from a model speaking `dialect`; `label` is
    the request id: it names the request in log lines and seeds the answer's call ids
    (the same answer parsed twice has the same ids)."""
    make_id = request_call_ids(label) if label else new_call_id
    return ToolCallParser(dialect_named(dialect), request.names, max_calls=request.max_calls, label=label,
                          make_id=make_id, text_calls=request.text_recovery, schemas=ToolSchemas(request.tools))
