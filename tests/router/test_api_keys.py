"""Named API keys and the admin key: where they come from, and what each may open."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from router.api_keys import KeyState, client_key, key_ring, parse_key_file
from router.middleware.auth import APIKeyMiddleware
from router.config import make_config
from router.config_values import ConfigError
from router.http_errors import EXCEPTION_HANDLERS


def _key_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "keys"
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_key_file_formats_comments_and_errors(tmp_path: Path) -> None:
    keys = parse_key_file(_key_file(tmp_path, "# team keys\n\nalice sk-alice\nbob = sk-bob  \n"))
    assert keys == {"alice": "sk-alice", "bob": "sk-bob"}
    with pytest.raises(ConfigError, match=r"keys:2: expected 'NAME KEY'"):
        parse_key_file(_key_file(tmp_path, "alice sk-a\nonlyname\n"))
    with pytest.raises(ConfigError, match="'alice' appears twice"):
        parse_key_file(_key_file(tmp_path, "alice a1\nalice a2\n"))
    with pytest.raises(ConfigError, match="holds no key"):
        parse_key_file(_key_file(tmp_path, "# nothing\n"))
    with pytest.raises(ConfigError, match="cannot read"):
        parse_key_file(tmp_path / "missing")


def test_ring_names_every_key_and_refuses_ambiguity(tmp_path: Path) -> None:
    config = make_config({"api_key": "sk-default", "api_keys": {"ci": "sk-ci"}, "admin_key": "sk-admin",
                          "api_key_file": _key_file(tmp_path, "alice sk-alice\n")})
    ring = key_ring(config)
    assert ring.names() == ["default", "ci", "alice", "admin"]
    assert ring.match("sk-alice").name == "alice" and ring.match("sk-admin").admin
    assert ring.match("sk-nope") is None and ring.match(None) is None
    assert "sk-" not in repr(ring)  # a key never reaches a log line through repr
    assert client_key(config) == "sk-admin"
    with pytest.raises(ConfigError, match="used twice"):
        key_ring(make_config({"api_keys": {"admin": "x1"}, "admin_key": "x2"}))
    with pytest.raises(ConfigError, match="same key"):
        key_ring(make_config({"api_keys": {"a": "same", "b": "same"}}))


def test_non_loopback_bind_needs_some_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--api-key, --api-key-file or --admin-key"):
        make_config({"host": "0.0.0.0"})
    for keys in ({"api_keys": {"a": "k"}}, {"admin_key": "k"}, {"api_key_file": tmp_path / "keys"}):
        assert make_config({"host": "0.0.0.0", **keys}).has_keys


async def _ok(request: Request) -> JSONResponse:
    return JSONResponse({"key": request.scope.get("state", {}).get("api_key_name")})


def _client(**settings: object) -> tuple[TestClient, KeyState]:
    keys = KeyState(key_ring(make_config(settings)))
    app = Starlette(routes=[Route("/v1/chat/completions", _ok, methods=["POST"]),
                            Route("/v1/messages", _ok, methods=["POST"]),
                            Route("/admin/status", _ok), Route("/health", _ok)],
                    middleware=[Middleware(APIKeyMiddleware, keys=keys)], exception_handlers=EXCEPTION_HANDLERS)
    return TestClient(app), keys


def test_user_keys_open_the_api_and_only_the_admin_key_opens_admin() -> None:
    client, keys = _client(api_keys={"alice": "sk-alice"}, admin_key="sk-admin")
    assert client.get("/health").status_code == 200  # probes need no key
    missing = client.post("/v1/chat/completions")
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"
    wrong = client.post("/v1/messages", headers={"x-api-key": "sk-wrong"})
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
    ok = client.post("/v1/chat/completions", headers={"Authorization": "Bearer sk-alice"})
    assert ok.status_code == 200 and ok.json() == {"key": "alice"}
    assert client.post("/v1/messages", headers={"x-api-key": "sk-alice"}).json() == {"key": "alice"}
    denied = client.get("/admin/status", headers={"Authorization": "Bearer sk-alice"})
    assert denied.status_code == 403, denied.text
    assert denied.json()["error"]["code"] == "insufficient_permissions" and "sk-alice" not in denied.text
    denied_anthropic = client.get("/admin/status", headers={"x-api-key": "sk-alice", "anthropic-version": "1"})
    assert denied_anthropic.status_code == 403 and denied_anthropic.json()["error"]["type"] == "permission_error"
    assert client.get("/admin/status", headers={"Authorization": "Bearer sk-admin"}).json() == {"key": "admin"}
    assert client.post("/v1/chat/completions", headers={"x-api-key": "sk-admin"}).status_code == 200
    status = {entry["name"]: entry for entry in keys.status()}  # refused requests do not count
    assert status["alice"]["requests"] == 2 and status["admin"]["requests"] == 2
    assert "sk-" not in repr(keys.status())


def test_without_an_admin_key_any_key_opens_admin() -> None:
    client, _ = _client(api_key="sk-one")
    assert client.get("/admin/status", headers={"Authorization": "Bearer sk-one"}).json() == {"key": "default"}
    assert client.get("/admin/status").status_code == 401


def test_swapping_the_ring_applies_to_the_next_request() -> None:
    client, keys = _client(api_keys={"old": "sk-old"})
    keys.ring = key_ring(make_config({"api_keys": {"new": "sk-new"}}))
    assert client.post("/v1/chat/completions", headers={"x-api-key": "sk-old"}).status_code == 401
    assert client.post("/v1/chat/completions", headers={"x-api-key": "sk-new"}).json() == {"key": "new"}


def test_metrics_follows_the_admin_rule_and_the_dashboard_files_need_no_key() -> None:
    keys = KeyState(key_ring(make_config({"api_keys": {"alice": "sk-alice"}, "admin_key": "sk-admin"})))
    app = Starlette(routes=[Route("/metrics", _ok), Route("/admin", _ok), Route("/admin/dashboard/{name}", _ok),
                            Route("/admin/status", _ok)],
                    middleware=[Middleware(APIKeyMiddleware, keys=keys)], exception_handlers=EXCEPTION_HANDLERS)
    client = TestClient(app)
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer sk-alice"}).status_code == 403
    assert client.get("/metrics", headers={"Authorization": "Bearer sk-admin"}).json() == {"key": "admin"}
    # the page and its assets carry no data: the page asks for the key and sends it itself
    assert client.get("/admin").status_code == 200 and client.get("/admin/dashboard/dashboard.js").status_code == 200
    assert client.get("/admin/status").status_code == 401
    assert client.get("/admin/dashboard/../status").status_code in (401, 404)  # never a way around the key
