"""`x-request-id` on every API answer: the id the request's log lines carry (`chatcmpl-...`,
`msg_...`, `resp_...`), so a user's report and the log meet. The route sets it in
`request.state` once the body is parsed; answers and errors from then on carry it."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID_HEADER = b"x-request-id"


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                request_id = scope.get("state", {}).get("request_id")
                if request_id and not any(k.lower() == REQUEST_ID_HEADER for k, _ in message.get("headers", [])):
                    message = {**message, "headers": [*message.get("headers", []),
                                                      (REQUEST_ID_HEADER, str(request_id).encode("latin-1"))]}
            await send(message)

        await self.app(scope, receive, send_with_id)
