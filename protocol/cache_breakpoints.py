"""A client's cache breakpoint (Anthropic's `cache_control`), as the router hands it to
the worker: a point of the request, not of its tokens.

The router has no tokenizer and the worker alone renders the chat template, so a
breakpoint names a place in `AddRequest.messages` / `AddRequest.tools` (a message and how
much of its content, or how many tools); the worker maps it to a token position of the
rendered prompt (`worker.cache_breakpoints`) and keeps the prefix up to it in its hot tier
for `ttl_s` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

TTL_5M_S = 300  # Anthropic's default breakpoint lifetime
TTL_1H_S = 3600  # `"ttl": "1h"`
MAX_CACHE_BREAKPOINTS = 4  # per request, as Anthropic allows


@dataclass
class CacheBreakpoint:
    """The prompt's prefix up to and including this point stays cached for `ttl_s`
    (refreshed by each request that carries the same breakpoint again).

    `message_index` >= 0: the point is in `messages[message_index]`, after its first
    `content_chars` characters of content (-1: after the whole message, tool calls
    included). `message_index` -1: the point is in the tools, after the first `num_tools`
    of them (the tools come first in Anthropic's cache order: tools, system, messages).
    """

    ttl_s: int = TTL_5M_S
    message_index: int = -1
    content_chars: int = -1
    num_tools: int = 0

    @property
    def in_tools(self) -> bool:
        return self.message_index < 0
