"""The request body size cap, answered in the API's error shape (413 JSON, not text)."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from protocol.errors import RequestError
from router.http_errors import error_response_for


# A body over the cap is read and dropped before the 413 goes out, up to this much: a
# server that answers and closes with request bytes unread makes the kernel reset the
# connection, and the client loses the answer it was sent. Past it, the client gets a
# reset rather than the server reading forever.
DRAIN_LIMIT_BYTES = 256 << 20


async def _drain(receive: Receive, limit: int) -> None:
    """Read and drop the rest of the request body (at most `limit` bytes)."""
    dropped = 0
    while dropped <= limit:
        message = await receive()
        if message["type"] != "http.request":
            return
        dropped += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def _too_large(max_bytes: int) -> RequestError:
    return RequestError(f"the request body is larger than {max_bytes} bytes (max_body_bytes); "
                        "send a shorter prompt", status=413, code="request_too_large")


class BodyLimitMiddleware:
    """Refuses bodies over `max_bytes`: before reading it when Content-Length says so,
    else as soon as the bytes read pass the cap (chunked uploads); the rest is read and
    dropped, never buffered.

    Pure ASGI, so streamed responses pass through untouched. The second case raises
    `RequestError` from `receive()`, inside the route, where the exception handlers turn
    it into the same 413 body.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await _drain(receive, DRAIN_LIMIT_BYTES)
            error = _too_large(self.max_bytes)
            # in the client's shape, as its route answers a chunked body over the cap
            response = error_response_for(scope, 413, error.code or "request_too_large", error.message)
            await response(scope, receive, send)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    if message.get("more_body", False):
                        await _drain(receive, DRAIN_LIMIT_BYTES)
                    raise _too_large(self.max_bytes)
            return message

        await self.app(scope, limited_receive, send)
