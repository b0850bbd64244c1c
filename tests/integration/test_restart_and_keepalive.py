"""Paths that were only tested on a fake worker or a toy app, against the real service:
requests sent while a worker restarts wait for it and are served, never refused or hung,
and streams get keep-alives during a prefill longer than the interval, on every dialect."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.service import Service

pytestmark = pytest.mark.timeout(300)
KEEPALIVE_S = 0.05  # far below any prefill of the long prompt below, so keep-alives must come


@pytest.fixture(scope="module")
def svc(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    service = Service(["--model", str(default_model_dir), "--sse-keepalive-s", str(KEEPALIVE_S),
                       "--shutdown-drain-s", "0.5"], home=tmp_path_factory.mktemp("home"))
    try:
        service.wait_ready()
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="module")
def model(svc: Service) -> str:
    return httpx.get(f"{svc.base_url}/v1/models", timeout=10).json()["data"][0]["id"]


def long_prompt(salt: str) -> str:
    return f"{salt}: " + " ".join(f"item{i % 89}" for i in range(700)) + ". Summarize."


@pytest.mark.parametrize(("path", "body", "keepalive"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "@"}], "max_tokens": 2}, b": keep-alive"),
    ("/v1/messages", {"messages": [{"role": "user", "content": "@"}], "max_tokens": 2}, b"event: ping"),
    ("/v1/responses", {"input": "@", "max_output_tokens": 2}, b"response.in_progress"),
])
def test_a_long_prefill_streams_keepalives(svc: Service, model: str, path: str, body: dict, keepalive: bytes) -> None:
    body = {**body, "model": model, "stream": True}
    text = long_prompt(path)
    body = {k: ([{**m, "content": text} for m in v] if k == "messages" else text if k == "input" else v)
            for k, v in body.items()}
    seen = b""
    with httpx.stream("POST", f"{svc.base_url}{path}", json=body, timeout=120) as answer:
        assert answer.status_code == 200
        for chunk in answer.iter_bytes():
            seen += chunk
    assert seen.count(keepalive) >= 2 + (path == "/v1/responses"), seen[:600]


@pytest.mark.parametrize(("path", "kind"), [("/v1/chat/completions", "chat.completion"), ("/v1/messages", "message")])
def test_a_long_prefill_pads_a_whole_answer(svc: Service, model: str, path: str, kind: str) -> None:
    """A non-streamed answer behind a long prefill starts with whitespace (one space per
    keep-alive interval), so no read timeout fires, and the JSON after it parses."""
    body = {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": long_prompt("whole" + path)}]}
    answer = httpx.post(f"{svc.base_url}{path}", json=body, timeout=120)
    assert answer.status_code == 200
    assert answer.content.startswith(b"  "), answer.content[:80]
    parsed = answer.json()
    assert parsed.get("object", parsed.get("type")) == kind, parsed


def test_a_padded_anthropic_answer_parses_in_the_sdk(svc: Service, model: str) -> None:
    anthropic = pytest.importorskip("anthropic")
    client = anthropic.Anthropic(base_url=svc.base_url, api_key="unused", max_retries=0)
    message = client.messages.create(model=model, max_tokens=2,
                                     messages=[{"role": "user", "content": long_prompt("sdk")}])
    assert message.type == "message" and message.usage.input_tokens > 700


def test_requests_during_a_worker_restart_wait_and_are_served(svc: Service, model: str) -> None:
    restart = threading.Thread(target=lambda: httpx.post(f"{svc.base_url}/admin/workers/{model}/restart",
                                                         timeout=120))
    restart.start()
    deadline = time.monotonic() + 60
    while svc.health()["workers"][model]["state"] == "ready":
        assert time.monotonic() < deadline, "the worker never left ready"
        time.sleep(0.01)
    chat_body = {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
    openai_answer = httpx.post(f"{svc.base_url}/v1/chat/completions", json=chat_body, timeout=120)
    anthropic_answer = httpx.post(f"{svc.base_url}/v1/messages", json=chat_body, timeout=120)
    restart.join(120)
    assert openai_answer.status_code == 200 and openai_answer.json()["object"] == "chat.completion", openai_answer.text
    assert anthropic_answer.status_code == 200 and anthropic_answer.json()["type"] == "message", anthropic_answer.text
    # the first waited through the restart: its body was padded (keep-alive 0.05 s here)
    assert openai_answer.content.startswith(b" "), openai_answer.content[:80]
    assert svc.health()["workers"][model]["restarts"] >= 1
