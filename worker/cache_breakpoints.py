"""Where a client's cache breakpoints (`protocol.cache_breakpoints`) fall in the prompt's
tokens, and the usage figures they imply (Anthropic's cache creation).

A breakpoint names a point of the request (a message and how much of its content, or how
many tools). It becomes a token position this way, deterministic and whatever the chat
template does: the request is cut after that point (the messages before it, the marked
message's content up to it; for a point in the tools, those tools with the leading system
message), the cut request is rendered and tokenized exactly as a prompt is, and the
position is the length of the common token prefix of the cut prompt and the whole one.
So the position is always a true prefix of the prompt, never past the point's text plus
the template's markup that follows it identically in both (e.g. `<|im_end|>\\n<|im_start|>`);
where a template renders something later in the request before the point (Qwen puts the
tools after the system text; a template that moves late system messages to the front),
the prefix holds what the rendered prompt has before the point, as it must.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from protocol.cache_breakpoints import TTL_1H_S, CacheBreakpoint
from worker.common_prefix import common_prefix

log = logging.getLogger(__name__)

Messages = list[dict[str, Any]]
Tools = list[dict[str, Any]] | None
Render = Callable[[Messages, Tools], list[int]]  # messages, tools -> token ids, ending with the last turn


@dataclass(frozen=True)
class BreakpointPosition:
    """The prompt's first `tokens` tokens are a breakpoint's prefix, to keep for `ttl_s`."""

    tokens: int
    ttl_s: int


@dataclass(frozen=True)
class CacheCreation:
    """Prompt tokens up to the last breakpoint that a request computes (its cache hit
    ends before them) and stores, and the part of them under a 1-hour breakpoint."""

    tokens: int = 0
    tokens_1h: int = 0


def cut_request(messages: Messages, tools: Tools, point: CacheBreakpoint) -> tuple[Messages, Tools]:
    """The request cut right after `point`: what renders the breakpoint's prefix.

    A point in the tools keeps the leading system message (templates that render tools in
    the system turn put its text first) and ends with an empty user turn (some templates
    index `messages[0]`). A message cut inside its content loses its tool calls (they
    render after the content)."""
    if point.in_tools:
        head = [m for m in messages[:1] if m.get("role") == "system"]
        return [*head, {"role": "user", "content": ""}], (tools or [])[:point.num_tools] or None
    if point.message_index >= len(messages):
        raise ValueError(f"message {point.message_index} of {len(messages)}")
    message = messages[point.message_index]
    content = message.get("content")
    if point.content_chars >= 0 and isinstance(content, str) and point.content_chars < len(content):
        message = {key: value for key, value in message.items() if key != "tool_calls"}
        message["content"] = content[:point.content_chars]
    return [*messages[:point.message_index], message], tools


def breakpoint_positions(render: Render, messages: Messages, tools: Tools, points: Sequence[CacheBreakpoint],
                         prompt_ids: Sequence[int], request_id: str = "") -> list[BreakpointPosition]:
    """Each breakpoint's token position in `prompt_ids` (the whole request rendered by
    `render`), in the breakpoints' order. One whose cut request cannot be rendered (a
    template that rejects it) is left out, logged: the request itself is unaffected."""
    positions = []
    for point in points:
        try:
            cut_messages, cut_tools = cut_request(messages, tools, point)
            ids = render(cut_messages, cut_tools)
        except Exception as exc:  # a template that rejects the cut request: no breakpoint there
            log.info("request %s: cache breakpoint %s ignored: its prefix does not render (%s)", request_id, point, exc)
            continue
        positions.append(BreakpointPosition(common_prefix(ids, prompt_ids), point.ttl_s))
    return positions


def cache_creation(positions: Sequence[BreakpointPosition], cached_tokens: int) -> CacheCreation:
    """What a request with these breakpoints writes to the cache: its prompt tokens from
    the end of its cache hit (`cached_tokens`) to its last breakpoint, split by TTL (the
    tokens up to its last 1-hour breakpoint are 1-hour ones). None without a breakpoint."""
    if not positions:
        return CacheCreation()
    last = max(p.tokens for p in positions)
    last_1h = max((p.tokens for p in positions if p.ttl_s >= TTL_1H_S), default=0)
    created = max(0, last - cached_tokens)
    return CacheCreation(created, min(created, max(0, last_1h - cached_tokens)))
