"""Every failure the router answers with, as an OpenAI-shaped JSON error body.

`{"error": {"message", "type", "param", "code"}}` for request errors, dead workers,
unknown routes and bugs alike: a client never sees HTML or a traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Scope

from protocol.errors import RequestError, WorkerDead

logger = logging.getLogger(__name__)

# 503s ask well-behaved clients (the openai SDK honours it) to retry after a restart
RETRY_AFTER_S = 2

_HTTP_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
}


def _printable(text: str | None) -> str | None:
    """`text` as valid Unicode: a message may quote what a client sent (a model name from
    the URL), and a lone surrogate there would make the error itself unrenderable."""
    if text is None or text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_body(
    message: str, error_type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The OpenAI error object (also what an SSE stream sends before it closes)."""
    return {"error": {"message": _printable(message), "type": error_type, "param": _printable(param),
                      "code": code}}


def request_error_body(error: RequestError) -> dict[str, Any]:
    return error_body(error.message, error.error_type, error.param, error.code)


def worker_dead_body(error: WorkerDead) -> dict[str, Any]:
    return error_body(str(error), "server_error", None, "worker_unavailable")


def error_response(
    status: int, message: str, error_type: str, param: str | None = None, code: str | None = None
) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
    return JSONResponse(error_body(message, error_type, param, code), status_code=status, headers=headers)


def request_error_response(error: RequestError) -> JSONResponse:
    return error_response(error.status, error.message, error.error_type, error.param, error.code)


def worker_dead_response(error: WorkerDead) -> JSONResponse:
    return error_response(503, str(error), "server_error", None, "worker_unavailable")


@dataclass(frozen=True)
class ErrorShape:
    """How one dialect answers a failure that happens before its route runs (a missing key,
    a body over the cap, a service still starting or draining). The dialect registers it
    (router/api/dialects.py), so the middlewares answer every client in its own shape
    without knowing any dialect."""

    path_prefix: str  # its routes: this path and everything under it
    header: str | None  # a header its clients send on every request, so any path is theirs
    respond: Callable[[int, str, str], Response]  # (status, kind, message) -> the answer

    def claims(self, path: str, headers: Headers) -> bool:
        if path == self.path_prefix or path.startswith(self.path_prefix + "/"):
            return True
        return self.header is not None and self.header in headers


_SHAPES: list[ErrorShape] = []


def register_error_shape(shape: ErrorShape) -> None:
    """Adds a dialect's shape; registering the same prefix again replaces it (a reload)."""
    _SHAPES[:] = [s for s in _SHAPES if s.path_prefix != shape.path_prefix] + [shape]


def error_response_for(scope: Scope, status: int, kind: str, message: str) -> Response:
    """The answer to a request refused before its route ran, in the shape its client reads:
    a registered dialect's, else OpenAI's with `kind` as the error code."""
    headers = Headers(scope=scope)
    for shape in _SHAPES:
        if shape.claims(scope["path"], headers):
            return shape.respond(status, kind, message)
    error_type = "server_error" if status >= 500 else "invalid_request_error"
    return error_response(status, message, error_type, None, kind)


async def _on_request_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestError)
    logger.info("%s %s -> %d %s", request.method, request.url.path, exc.status, exc.message)
    return request_error_response(exc)


async def _on_worker_dead(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, WorkerDead)
    return worker_dead_response(exc)


async def _on_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"no route {request.method} {request.url.path}"
    elif exc.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    error_type = _HTTP_ERROR_TYPES.get(exc.status_code, "invalid_request_error")
    if exc.status_code >= 500:
        error_type = "server_error"
    response = error_response(exc.status_code, message, error_type)
    if exc.headers:
        response.headers.update(exc.headers)
    return response


async def _on_unexpected(request: Request, exc: Exception) -> Response:
    # Starlette re-raises after this handler, so uvicorn still logs the traceback
    logger.error("unhandled %s on %s %s", type(exc).__name__, request.method, request.url.path)
    return error_response(500, f"internal server error ({type(exc).__name__}); see the mlxd log", "server_error")


EXCEPTION_HANDLERS: dict[Any, Any] = {
    RequestError: _on_request_error,
    WorkerDead: _on_worker_dead,
    HTTPException: _on_http_exception,
    Exception: _on_unexpected,
}
