"""router.middleware.web_guard: what a web page may make the router do (Host, Origin, Content-Type,
CORS), over a tiny app with the real middleware stack; /health without the key, and the
wiring, through the real router in front of a fake worker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from router.api_keys import KeyState, key_ring
from router.cli.mlxd import build_parser
from router.cli.settings_flags import config_from_args
from router.middleware.auth import APIKeyMiddleware
from router.config import ConfigError, make_config
from router.http_errors import EXCEPTION_HANDLERS
from router.middleware.web_guard import split_authority, web_middleware
from tests.router.router_harness import MODEL_ID, RunningRouter, start_router

pytestmark = pytest.mark.timeout(60)

OWN = "http://127.0.0.1:8000"  # the default --host and --port
APP = "http://app.example:3000"
JSON = {"content-type": "application/json"}
ERROR_KEYS = {"message", "type", "param", "code"}


async def _ok(request: Request) -> JSONResponse:
    return JSONResponse({"received": len(await request.body())})


def _client(**settings: Any) -> TestClient:
    """The router's middleware stack (as router.app wires it) over two routes."""
    config = make_config(settings)
    keys = KeyState(key_ring(config))
    app = Starlette(
        routes=[Route("/v1/chat/completions", _ok, methods=["GET", "POST"]),
                Route("/admin/models/{model:path}/unload", _ok, methods=["POST"])],
        middleware=[*web_middleware(config, keys), Middleware(APIKeyMiddleware, keys=keys)],
        exception_handlers=EXCEPTION_HANDLERS,
    )
    return TestClient(app, base_url=OWN)


def _refused(response: httpx.Response, status: int, error_type: str, code: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == ERROR_KEYS and (error["type"], error["code"]) == (error_type, code)
    return error["message"]


# ---------------------------------------------------------------- Host


@pytest.mark.parametrize("host, settings, status", [
    ("localhost:8000", {}, 200),
    ("localhost", {}, 200),
    ("LOCALHOST.:8000", {}, 200),
    ("app.localhost:8000", {}, 200),
    ("127.0.0.1", {}, 200),
    ("127.5.5.5:8000", {}, 200),
    ("[::1]:8000", {}, 200),
    ("[::1]", {}, 200),
    ("evil.example", {}, 403),
    ("evil.example:8000", {}, 403),
    ("localhost.evil.example", {}, 403),
    ("127.0.0.1.evil.example", {}, 403),
    ("192.168.1.4:8000", {}, 403),
    ("::1", {}, 403),  # unbracketed IPv6: malformed
    ("localhost:http", {}, 403),
    ("", {}, 403),
    ("mybox.lan:8000", {"allowed_hosts": ["mybox.lan"]}, 200),
    ("MyBox.LAN", {"allowed_hosts": ["mybox.lan"]}, 200),
    ("other.lan:8000", {"allowed_hosts": ["mybox.lan"]}, 403),
    ("evil.example:8000", {"allowed_hosts": ["*"]}, 200),
    ("[::1]:8000", {"host": "::1"}, 200),
])
def test_host_without_a_key(host: str, settings: dict[str, Any], status: int) -> None:
    response = _client(**settings).get("/v1/chat/completions", headers={"host": host})
    if status == 200:
        assert response.status_code == 200, response.text
    else:
        message = _refused(response, 403, "permission_error", "host_not_allowed")
        assert repr(host) in message and "allowed_hosts" in message


@pytest.mark.parametrize("headers, status", [
    ({"authorization": "Bearer k"}, 200),  # a page cannot send the key, so any name will do
    ({}, 401),  # then the key check answers
])
def test_host_is_not_checked_with_a_key(headers: dict[str, str], status: int) -> None:
    response = _client(api_key="k").get("/v1/chat/completions", headers={"host": "evil.example", **headers})
    assert response.status_code == status


def _asgi_status(app: Any, headers: list[tuple[bytes, bytes]]) -> int:
    """Drive `app` with a raw GET (TestClient always adds a Host header); its status code."""
    import anyio

    sent: list[dict[str, Any]] = []
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.0", "method": "GET",
             "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "root_path": "", "headers": headers, "client": ("127.0.0.1", 5000),
             "server": ("127.0.0.1", 8000)}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    anyio.run(app, scope, receive, send)
    return sent[0]["status"]


def test_no_host_header_passes_because_browsers_always_send_one() -> None:
    app = _client().app
    assert _asgi_status(app, []) == 200
    assert _asgi_status(app, [(b"host", b"evil.example")]) == 403


@pytest.mark.parametrize("value, parts", [
    ("localhost:8000", ("localhost", 8000)),
    ("[::1]:8000", ("::1", 8000)),
    ("[::1]", ("::1", None)),
    ("Example.COM.", ("example.com", None)),
    ("[::1", None),
    ("[::1]x", None),
    ("a:b", None),
    (":8000", None),
])
def test_split_authority(value: str, parts: tuple[str, int | None] | None) -> None:
    assert split_authority(value) == parts


# ---------------------------------------------------------------- Content-Type


@pytest.mark.parametrize("content_type, body, status", [
    ("text/plain", b'{"model": "m"}', 415),
    ("application/x-www-form-urlencoded", b"model=m", 415),
    ("multipart/form-data; boundary=x", b"--x--", 415),
    (None, b'{"model": "m"}', 415),
    ("application/json-patch+json", b"{}", 415),
    ("application/json", b"{}", 200),
    ("application/json; charset=utf-8", b"{}", 200),
    ("Application/JSON;charset=UTF-8", b"{}", 200),
    ("text/plain", b"", 200),  # an empty body carries nothing to misread
    (None, b"", 200),
])
def test_post_needs_json_without_a_key(content_type: str | None, body: bytes, status: int) -> None:
    headers = {"content-type": content_type} if content_type else {}
    response = _client().post("/v1/chat/completions", content=body, headers=headers)
    if status == 200:
        assert response.status_code == 200, response.text
    else:
        message = _refused(response, 415, "invalid_request_error", "unsupported_media_type")
        assert message.startswith("send Content-Type: application/json")


def test_a_chunked_body_counts_as_a_body() -> None:
    response = _client().post("/v1/chat/completions", content=iter([b"{}"]), headers={"content-type": "text/plain"})
    _refused(response, 415, "invalid_request_error", "unsupported_media_type")


def test_an_empty_admin_post_passes() -> None:
    assert _client().post(f"/admin/models/{MODEL_ID}/unload").status_code == 200


def test_content_type_is_not_checked_with_a_key() -> None:
    response = _client(api_key="k").post("/v1/chat/completions", content=b"{}",
                                         headers={"content-type": "text/plain", "authorization": "Bearer k"})
    assert response.status_code == 200


# ---------------------------------------------------------------- Origin and CORS


@pytest.mark.parametrize("origin, settings, status", [
    (OWN, {}, 200),
    ("http://localhost:8000", {}, 200),
    ("http://[::1]:8000", {}, 200),
    ("HTTP://LOCALHOST:8000", {}, 200),
    ("http://mybox.lan:8000", {"allowed_hosts": ["mybox.lan"]}, 200),
    ("http://localhost", {"port": 80}, 200),
    ("http://mybox.lan:8000", {"host": "mybox.lan", "api_key": "k"}, 200),  # the bound --host
    ("http://mybox.lan:8000", {"host": "0.0.0.0", "api_key": "k"}, 403),
    ("http://localhost", {}, 403),  # port 80, not ours
    ("http://127.0.0.1:3000", {}, 403),  # another local app is another origin
    ("https://127.0.0.1:8000", {}, 403),
    ("http://evil.example", {}, 403),
    ("http://evil.example:8000", {}, 403),
    ("http://evil.example:8000", {"allowed_hosts": ["*"]}, 403),  # "*" hosts do not make every site ours
    ("http://127.0.0.1:8000@evil.example", {}, 403),
    ("null", {}, 403),
    ("null", {"cors_origins": [APP]}, 403),
    (APP, {"cors_origins": [APP]}, 200),
    (APP, {"cors_origins": ["HTTP://App.Example:3000"]}, 200),
    ("http://app.example:3001", {"cors_origins": [APP]}, 403),
    ("null", {"cors_origins": ["*"]}, 200),
    ("http://evil.example", {"cors_origins": ["*"]}, 200),
])
def test_origin(origin: str, settings: dict[str, Any], status: int) -> None:
    client = _client(**settings)
    headers = {"origin": origin, "host": "localhost:8000", "authorization": "Bearer k"}  # the key if one is set
    for response in (client.get("/v1/chat/completions", headers=headers),
                     client.post(f"/admin/models/{MODEL_ID}/unload", headers=headers)):
        if status == 200:
            assert response.status_code == 200, response.text
        else:
            message = _refused(response, 403, "permission_error", "origin_not_allowed")
            assert repr(origin) in message and "cors_origins" in message


def test_a_foreign_origin_is_refused_with_a_key_too() -> None:
    response = _client(api_key="k").post(f"/admin/models/{MODEL_ID}/unload",
                                         headers={"origin": "http://evil.example", "authorization": "Bearer k"})
    _refused(response, 403, "permission_error", "origin_not_allowed")


PREFLIGHT = {"access-control-request-method": "POST",
             "access-control-request-headers": "authorization, content-type, x-stainless-os"}


@pytest.mark.parametrize("settings", [{}, {"cors_origins": [APP]}, {"cors_origins": [APP], "api_key": "k"}])
def test_a_foreign_preflight_is_refused(settings: dict[str, Any]) -> None:
    response = _client(**settings).options("/v1/chat/completions",
                                           headers={"origin": "http://evil.example", **PREFLIGHT})
    _refused(response, 403, "permission_error", "origin_not_allowed")
    assert "access-control-allow-origin" not in response.headers


@pytest.mark.parametrize("settings", [{"cors_origins": [APP]}, {"cors_origins": [APP], "api_key": "k"}])
def test_a_listed_origin_gets_cors_answers(settings: dict[str, Any]) -> None:
    client = _client(**settings)
    preflight = client.options("/v1/chat/completions", headers={"origin": APP, **PREFLIGHT})
    assert preflight.status_code == 200, preflight.text  # no key needed: a preflight never carries it
    assert preflight.headers["access-control-allow-origin"] == APP
    assert set(preflight.headers["access-control-allow-methods"].split(", ")) == {"GET", "POST"}
    assert preflight.headers["access-control-allow-headers"] == PREFLIGHT["access-control-request-headers"]
    key = {"authorization": "Bearer k"} if "api_key" in settings else {}
    response = client.post("/v1/chat/completions", json={}, headers={"origin": APP, **key})
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == APP
    assert "Retry-After" in response.headers["access-control-expose-headers"]


def test_a_listed_origin_can_read_why_it_was_refused() -> None:
    response = _client(cors_origins=[APP]).post("/v1/chat/completions", content=b"{}",
                                                headers={"origin": APP, "content-type": "text/plain"})
    _refused(response, 415, "invalid_request_error", "unsupported_media_type")
    assert response.headers["access-control-allow-origin"] == APP


def test_any_origin_gets_a_wildcard() -> None:
    response = _client(cors_origins=["*"]).get("/v1/chat/completions", headers={"origin": "http://x.example"})
    assert response.status_code == 200 and response.headers["access-control-allow-origin"] == "*"


def test_without_cors_origins_no_cors_headers_are_sent() -> None:
    response = _client().get("/v1/chat/completions", headers={"origin": OWN})
    assert response.status_code == 200 and "access-control-allow-origin" not in response.headers


# ---------------------------------------------------------------- settings


@pytest.mark.parametrize("settings, key", [
    ({"allowed_hosts": ["http://mybox.lan"]}, "allowed_hosts"),
    ({"allowed_hosts": ["mybox.lan:8000"]}, "allowed_hosts"),
    ({"allowed_hosts": [""]}, "allowed_hosts"),
    ({"cors_origins": ["http://localhost:3000/"]}, "cors_origins"),
    ({"cors_origins": ["localhost:3000"]}, "cors_origins"),
    ({"cors_origins": ["null"]}, "cors_origins"),
])
def test_bad_settings_name_their_key(settings: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make_config(settings)
    assert caught.value.key == key


def test_flags_repeat() -> None:
    args = build_parser().parse_args(["serve", "--allowed-hosts", "a.lan", "--allowed-hosts", "b.lan",
                                          "--cors-origins", APP, "--cors-origins", "chrome-extension://abc"])
    config = config_from_args(args)
    assert config.allowed_hosts == ("a.lan", "b.lan")
    assert config.cors_origins == (APP, "chrome-extension://abc")


# ---------------------------------------------------------------- /health and wiring, real router


@pytest.fixture
def keyed_router(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningRouter]:
    yield from start_router(model_dir, monkeypatch, api_key="k")


@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer wrong"}, {"x-api-key": "wrong"}])
def test_health_without_the_key_shows_only_states(keyed_router: RunningRouter, headers: dict[str, str]) -> None:
    with keyed_router.client() as client:
        response = client.get("/health", headers=headers)
    assert response.status_code == 200
    body = response.json()
    expected = {"status": "ok", "workers": {MODEL_ID: {"state": "ready"}}}
    if "kvstore" in body:
        expected["kvstore"] = {"state": body["kvstore"]["state"]}
    assert body == expected


@pytest.mark.parametrize("headers", [{"authorization": "Bearer k"}, {"x-api-key": "k"}])
def test_health_with_the_key_shows_everything(keyed_router: RunningRouter, headers: dict[str, str]) -> None:
    with keyed_router.client() as client:
        worker = client.get("/health", headers=headers).json()["workers"][MODEL_ID]
    assert worker["state"] == "ready" and worker["pid"] > 0 and "last_error" in worker


def test_the_real_router_is_guarded(router: RunningRouter) -> None:
    with router.client() as client:
        assert client.get("/health").json()["workers"][MODEL_ID]["pid"] > 0  # no key configured: all of it
        _refused(client.get("/v1/models", headers={"host": "evil.example"}), 403, "permission_error",
                 "host_not_allowed")
        _refused(client.post("/v1/chat/completions", content=b"{}", headers={"content-type": "text/plain"}),
                 415, "invalid_request_error", "unsupported_media_type")
        _refused(client.post(f"/admin/models/{MODEL_ID}/unload", headers={"origin": "http://evil.example"}),
                 403, "permission_error", "origin_not_allowed")
        assert client.get("/health").json()["workers"][MODEL_ID]["state"] == "ready"
        reply = client.post("/v1/chat/completions", headers=JSON,
                            json={"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}]})
        assert reply.status_code == 200, reply.text
