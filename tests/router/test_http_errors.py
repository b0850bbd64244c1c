"""router.http_errors and router.middleware.auth: every error is OpenAI-shaped JSON, never HTML."""

from __future__ import annotations

import json

import pytest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from protocol.errors import RequestError, WorkerDead
from router.api_keys import ApiKey, KeyRing, KeyState
from router.middleware.auth import APIKeyMiddleware
from router.http_errors import EXCEPTION_HANDLERS, error_body, request_error_response, worker_dead_response

ERROR_KEYS = {"message", "type", "param", "code"}


def test_error_body_shape() -> None:
    assert error_body("m", "t", "p", "c") == {"error": {"message": "m", "type": "t", "param": "p", "code": "c"}}


@pytest.mark.parametrize("error, status", [
    (RequestError("bad n", param="n"), 400),
    (RequestError("no such model", status=404, param="model", code="model_not_found"), 404),
    (RequestError("too long", status=400, code="context_length_exceeded"), 400),
])
def test_request_error_response(error: RequestError, status: int) -> None:
    response = request_error_response(error)
    body = json.loads(response.body)
    assert response.status_code == status
    assert body["error"] == {"message": error.message, "type": error.error_type, "param": error.param,
                             "code": error.code}


def test_worker_dead_is_a_503_with_retry_after() -> None:
    response = worker_dead_response(WorkerDead("worker died"))
    assert response.status_code == 503 and response.headers["retry-after"]
    assert json.loads(response.body)["error"] == {"message": "worker died", "type": "server_error",
                                                  "param": None, "code": "worker_unavailable"}


async def _raise(request: Request) -> Response:
    kind = request.path_params.get("kind", "ok")
    if kind == "request":
        raise RequestError("bad temperature", param="temperature")
    if kind == "dead":
        raise WorkerDead("gone")
    if kind == "http":
        raise HTTPException(413, "body too large")
    if kind == "bug":
        raise ZeroDivisionError("oops")
    return JSONResponse({"ok": True})


def _app(api_key: str | None = None) -> Starlette:
    return Starlette(routes=[Route("/raise/{kind}", _raise), Route("/health", _raise)],
                     exception_handlers=EXCEPTION_HANDLERS,
                     middleware=[Middleware(APIKeyMiddleware, keys=KeyState(
                         KeyRing((ApiKey("default", api_key),) if api_key is not None else ())))])


@pytest.mark.parametrize("method, path, status, error_type", [
    ("GET", "/raise/request", 400, "invalid_request_error"),
    ("GET", "/raise/dead", 503, "server_error"),
    ("GET", "/raise/http", 413, "invalid_request_error"),
    ("GET", "/raise/bug", 500, "server_error"),
    ("GET", "/no/such/route", 404, "not_found_error"),
    ("DELETE", "/raise/request", 405, "invalid_request_error"),
])
def test_handlers_answer_json(method: str, path: str, status: int, error_type: str) -> None:
    client = TestClient(_app(), raise_server_exceptions=False)
    response = client.request(method, path)
    assert response.status_code == status
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body["error"]) == ERROR_KEYS and body["error"]["type"] == error_type
    assert "Traceback" not in response.text and "<html" not in response.text.lower()


@pytest.mark.parametrize("headers, status", [
    ({}, 401),
    ({"Authorization": "Bearer wrong"}, 401),
    ({"Authorization": "Basic secret"}, 401),
    ({"Authorization": "Bearer secret"}, 200),
    ({"authorization": "bearer secret"}, 200),
    ({"x-api-key": "secret"}, 200),
])
def test_api_key(headers: dict[str, str], status: int) -> None:
    client = TestClient(_app(api_key="secret"))
    response = client.get("/raise/ok", headers=headers)
    assert response.status_code == status
    if status == 401:
        assert response.json()["error"]["code"] == "invalid_api_key"


def test_health_needs_no_key_and_no_key_means_open() -> None:
    assert TestClient(_app(api_key="secret")).get("/health").status_code == 200
    assert TestClient(_app(api_key=None)).get("/raise/ok").status_code == 200
