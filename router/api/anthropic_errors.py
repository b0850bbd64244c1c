"""Errors on the Anthropic routes, in Anthropic's shape: `{"type": "error", "error":
{"type", "message"}}` with Anthropic's status codes, as an HTTP response before the stream
starts and as an `error` event after.

The rest of mlxd raises the same `RequestError` / `WorkerDead` for every API; only these
routes translate them, so OpenAI clients keep OpenAI's shape.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from starlette.responses import JSONResponse

from protocol.errors import RequestError, WorkerDead
from router.http_errors import RETRY_AFTER_S

logger = logging.getLogger(__name__)

OVERLOADED = 529  # Anthropic's "overloaded": its SDKs and Claude Code retry it with backoff
_TYPES_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    OVERLOADED: "overloaded_error",
}
# the phrase Claude Code looks for to compact its conversation instead of failing the turn
PROMPT_TOO_LONG = "prompt is too long"


def error_body(error_type: str, message: str) -> dict[str, Any]:
    """The error object, the same in a body and in an `error` event."""
    return {"type": "error", "error": {"type": error_type, "message": message}}


def error_response(status: int, error_type: str, message: str) -> JSONResponse:
    """An Anthropic error answer; a 5xx asks the client to retry shortly."""
    request_id = f"req_{uuid.uuid4().hex[:24]}"
    headers = {"request-id": request_id}
    if status >= 500:
        headers["retry-after"] = str(RETRY_AFTER_S)
    body = {**error_body(error_type, message), "request_id": request_id}
    return JSONResponse(body, status_code=status, headers=headers)


def refusal(status: int, kind: str, message: str) -> JSONResponse:
    """The answer to a request the service refused before its route ran (its ErrorShape,
    `router.http_errors.error_response_for`): the type its status has in Anthropic's API;
    a wrong key worded as Anthropic words it."""
    if kind == "invalid_api_key":
        message = "invalid x-api-key"
    error_type = _TYPES_BY_STATUS.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return error_response(status, error_type, message)


def request_error_status(error: RequestError) -> tuple[int, str, str]:
    """(status, error type, message) of a failed request, as Anthropic would answer it: a
    full queue is 529 overloaded, a prompt over the context window says "prompt is too
    long" first."""
    message = error.message
    if error.code == "context_length_exceeded":
        tokens, window = getattr(error, "num_prompt_tokens", None), getattr(error, "context_window", None)
        if tokens and window:
            return 400, "invalid_request_error", f"{PROMPT_TOO_LONG}: {tokens} tokens > {window} maximum"
        return 400, "invalid_request_error", f"{PROMPT_TOO_LONG}: {message}"
    if error.code == "queue_full":
        return OVERLOADED, "overloaded_error", message
    status = error.status
    if status in _TYPES_BY_STATUS:
        return status, _TYPES_BY_STATUS[status], message
    if status >= 500:
        return status, "api_error", message
    return status, "invalid_request_error", message


def answer_error(exc: Exception) -> JSONResponse:
    """The HTTP answer to an exception raised before the stream started."""
    if isinstance(exc, RequestError):
        status, error_type, message = request_error_status(exc)
        logger.info("anthropic request -> %d %s", status, message)
        return error_response(status, error_type, message)
    if isinstance(exc, WorkerDead):  # restarting or failed to load: retry shortly
        return error_response(OVERLOADED, "overloaded_error", str(exc))
    logger.exception("anthropic request failed")
    return error_response(500, "api_error", f"internal server error ({type(exc).__name__}); see the mlxd log")


def stream_error_body(exc: Exception) -> dict[str, Any]:
    """The `error` event's data for a failure after the stream started."""
    if isinstance(exc, RequestError):
        _, error_type, message = request_error_status(exc)
        return error_body(error_type, message)
    if isinstance(exc, WorkerDead):
        return error_body("overloaded_error", str(exc))
    return error_body("api_error", f"internal server error ({type(exc).__name__}); see the mlxd log")
