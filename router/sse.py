"""Server-sent events: framing, the keep-alive timer, and a response that reports its end.

Keep-alives are SSE comments (`: keep-alive`), which every client ignores but which keep
proxies and client read timeouts from giving up during a long prefill.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterable, Callable
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

logger = logging.getLogger(__name__)

KEEPALIVE = b": keep-alive\n\n"
DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_data(payload: dict[str, Any]) -> bytes:
    """One `data:` event holding `payload` as compact JSON (never contains a raw newline)."""
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def sse_event(payload: dict[str, Any]) -> bytes:
    """One named event, `event: <type>` + `data: <payload>`, the name being the payload's
    `type` (Anthropic's framing; clients dispatch on the name)."""
    return f"event: {payload['type']}\n".encode() + sse_data(payload)


class KeepAliveTimer:
    """When the stream next owes the client a keep-alive: `interval_s` after the last write.

    Wall-clock based, so events that produce no output (prefill progress) do not
    postpone it.
    """

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._due = time.monotonic() + interval_s

    def wrote(self) -> None:
        """Something reached the client; restart the countdown."""
        self._due = time.monotonic() + self.interval_s

    def remaining(self) -> float:
        return max(0.0, self._due - time.monotonic())


class EventStreamResponse(StreamingResponse):
    """A `text/event-stream` response that calls `on_close` however the stream ends.

    Normal end, client disconnect (Starlette cancels the body iterator) or an error all
    pass through `on_close`, synchronously, so the caller can abort work at the worker
    without relying on when a half-consumed async generator gets garbage-collected.
    """

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterable[bytes], on_close: Callable[[], None],
                 media_type: str = "text/event-stream") -> None:
        super().__init__(content, headers=SSE_HEADERS, media_type=media_type)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                self._on_close()
            except Exception:
                logger.exception("SSE on_close callback failed")
