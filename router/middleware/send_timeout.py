"""A client that stops reading its answer is cut off after `stream_send_timeout_s`.

A stream's bytes leave through the connection's write buffer; once it is full (uvicorn
pauses at 64 KiB), a write waits for the client to read. Without a bound, a client that
stops reading would keep its request decoding to `max_tokens` and then hold the answer
forever. With it, the waiting write raises, the response's `on_close` aborts the request
at the worker (its slot goes to others), and the router holds no more than the buffers.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)


class ClientStalled(Exception):
    """A write to the client waited longer than the send timeout."""


class SendTimeoutMiddleware:
    """Bounds every write of an answer by `timeout_s`; a stalled answer ends quietly (one
    warning), since the client is not reading anything we could tell it."""

    def __init__(self, app: ASGIApp, timeout_s: float) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def timed_send(message: Message) -> None:
            try:
                await asyncio.wait_for(send(message), self.timeout_s)
            except TimeoutError:
                raise ClientStalled(f"the client read nothing for {self.timeout_s:g} s") from None

        try:
            await self.app(scope, receive, timed_send)
        except ClientStalled as exc:
            request_id = scope.get("state", {}).get("request_id", "-")
            logger.warning("%s %s (%s): %s (stream_send_timeout_s); request cancelled", scope.get("method"),
                           scope.get("path"), request_id, exc)
