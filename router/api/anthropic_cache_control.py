"""Anthropic's `cache_control` breakpoints, read off a Messages body while it becomes the
internal chat request (`router.api.anthropic_messages`), as dialect-neutral
`CacheBreakpoint`s: a message of the internal request and how much of its content, or how
many tools. The worker maps each to a token position and keeps the prefix up to it in its
hot tier for the TTL (`worker.cache_breakpoints`, `worker.breakpoint_pins`).

`cache_control` never reaches the prompt: the same text with or without it renders the
same tokens, so a block marked in one request and plain in the next still hits the cache.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from protocol.cache_breakpoints import MAX_CACHE_BREAKPOINTS, TTL_1H_S, TTL_5M_S, CacheBreakpoint
from router.validation import bad, short

logger = logging.getLogger(__name__)

TTLS: dict[Any, int] = {None: TTL_5M_S, "5m": TTL_5M_S, "1h": TTL_1H_S}
WHOLE = -1  # content_chars of a breakpoint after the whole message

_logged_types: set[str] = set()

# A breakpoint while the body is read: (index in the list of turns being built, or HEAD
# for the leading system message; characters of its content up to the point, or WHOLE;
# TTL in seconds)
Mark = tuple[int, int, int]
HEAD = -1


class BreakpointReader:
    """Reads each block's `cache_control` and counts them: Anthropic allows at most four
    per request (`check`), and so does mlxd."""

    def __init__(self) -> None:
        self.found = 0

    def ttl_s(self, block: Any, where: str, param: str = "messages") -> int | None:
        """The TTL of the breakpoint `block` carries, None if it has none. A `type` other
        than "ephemeral" is not a breakpoint mlxd knows: ignored, logged once."""
        control = block.get("cache_control") if isinstance(block, dict) else None
        if control is None:
            return None
        name = f"{where}.cache_control" if where else "cache_control"
        if not isinstance(control, dict):
            raise bad(param, f"'{name}' must be an object like {{\"type\": \"ephemeral\"}}")
        kind = control.get("type", "ephemeral")
        if kind != "ephemeral":
            if str(kind) not in _logged_types:
                _logged_types.add(str(kind))
                logger.info("messages: cache_control of type %r is not a breakpoint mlxd knows; ignored "
                            "(logged once)", kind)
            return None
        ttl = control.get("ttl")
        if not isinstance(ttl, (str, type(None))) or ttl not in TTLS:
            raise bad(param, f"'{name}.ttl' must be \"5m\" or \"1h\", got {short(ttl)}")
        self.found += 1
        return TTLS[ttl]

    def check(self) -> None:
        if self.found > MAX_CACHE_BREAKPOINTS:
            raise bad("messages", f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be "
                      f"provided. Found {self.found}.")


def text_marks(parts: Sequence[tuple[str | None, int | None]], separator: str = "\n") -> tuple[list[str], list[
        tuple[int, int]]]:
    """The texts of one message's blocks (None: a block not rendered) and, per breakpoint
    among them, (characters of the joined text up to and including its block, TTL). A
    breakpoint before any text marks nothing in this message."""
    texts: list[str] = []
    marks: list[tuple[int, int]] = []
    for text, ttl in parts:
        if text is not None:
            texts.append(text)
        if ttl is not None and texts:
            marks.append((len(separator.join(texts)), ttl))
    return texts, marks


def breakpoints(marks: Sequence[Mark], messages: Sequence[dict[str, Any]], has_head: bool) -> list[CacheBreakpoint]:
    """The marks made while the turns were built, as breakpoints of the final `messages`
    (which start with the leading system message if `has_head`), in the body's order. A
    mark that covers all of its message's text marks the whole message (its end of turn
    included); marks on turns that did not make it (an empty assistant turn at the end)
    are dropped."""
    offset = 1 if has_head else 0
    points = []
    for turn, chars, ttl in marks:
        if turn == HEAD and not has_head:
            continue
        index = 0 if turn == HEAD else turn + offset
        if index >= len(messages):
            continue
        content = messages[index].get("content")
        if chars != WHOLE and isinstance(content, str) and chars >= len(content):
            chars = WHOLE
        points.append(CacheBreakpoint(ttl, index, chars))
    return points
