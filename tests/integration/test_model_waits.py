"""Requests wait for their model, on the real service with the official SDKs: a model not
loaded at start serves concurrent requests on every API after one load; requests during
a worker restart or after a crash wait and are served; a load that fails answers every
waiter a clear 503 at once, and a wait past load_timeout_s answers a 503."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.service import Service
from tests.integration.test_pool import make_tiny_dir

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

pytestmark = pytest.mark.timeout(600)

MODEL = "SmolLM2-135M-Instruct"
BROKEN = "broken-model"
TINY = "tiny-llama"  # the model loaded at start: a service always starts with one
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def models_dir(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model, a copy of it whose weights are garbage, and a tiny one to start with."""
    models = tmp_path_factory.mktemp("models")
    os.symlink(default_model_dir, models / MODEL)
    make_tiny_dir(models / TINY, default_model_dir)
    broken = models / BROKEN
    broken.mkdir()
    for path in default_model_dir.iterdir():
        if path.suffix != ".safetensors" and path.is_file():
            shutil.copy(path, broken / path.name)
    for path in default_model_dir.glob("*.safetensors"):
        garbage = b"not a safetensors header, nor any tensor"
        (broken / path.name).write_bytes(len(garbage).to_bytes(8, "little") + garbage + b"\0" * 4096)
    return models


def start(models_dir: Path, home: Path, *flags: str) -> Service:
    """A service that loads only the tiny model at start; the others are listed, not loaded."""
    svc = Service(["--model-dir", str(models_dir), "--model", TINY, "--no-cold-tier", *flags], home=home)
    deadline = time.monotonic() + 120
    while True:
        assert svc.proc.poll() is None, svc.log_text()[-3000:]
        try:
            if httpx.get(f"{svc.base_url}/health", timeout=2).json().get("workers", {}).get(TINY, {}).get(
                    "state") == "ready":
                return svc
        except (httpx.HTTPError, ValueError):
            pass
        assert time.monotonic() < deadline, svc.log_text()[-3000:]
        time.sleep(0.2)


@pytest.fixture(scope="module")
def svc(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    service = start(models_dir, tmp_path_factory.mktemp("home"), "--sse-keepalive-s", "0.5",
                    "--shutdown-drain-s", "0.5")
    try:
        yield service
    finally:
        service.stop()


def clients(svc: Service) -> tuple[Any, Any]:
    return (openai.OpenAI(base_url=f"{svc.base_url}/v1", api_key="unused", max_retries=0, timeout=300),
            anthropic.Anthropic(base_url=svc.base_url, api_key="unused", max_retries=0, timeout=300))


def concurrently(calls: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    """Run the calls at once, each in its own thread: each one's result or exception."""
    results: dict[str, Any] = {}

    def run(name: str) -> None:
        try:
            results[name] = calls[name]()
        except Exception as exc:  # noqa: BLE001  (the test looks at it)
            results[name] = exc

    threads = [threading.Thread(target=run, args=(name,)) for name in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    return results


def four_requests(svc: Service) -> dict[str, Callable[[], str]]:
    """Chat whole, chat streamed, Anthropic messages streamed, Responses: each one's text."""
    oa, an = clients(svc)
    common = {"model": MODEL, "max_tokens": 12, "temperature": 0}

    def chat() -> str:
        return oa.chat.completions.create(messages=QUESTION, **common).choices[0].message.content

    def chat_streamed() -> str:
        chunks = oa.chat.completions.create(messages=QUESTION, stream=True, **common)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    def messages_streamed() -> str:
        # this SDK has no `temperature` argument any more; the server still reads the field
        with an.messages.stream(model=MODEL, max_tokens=12, messages=QUESTION, extra_body={"temperature": 0}) as stream:
            return stream.get_final_message().content[0].text

    def responses() -> str:
        return oa.responses.create(model=MODEL, input=QUESTION[0]["content"], max_output_tokens=12,
                                   temperature=0).output_text

    return {"chat": chat, "chat-streamed": chat_streamed, "messages-streamed": messages_streamed,
            "responses": responses}


def num_loads(svc: Service, model: str) -> int:
    return sum(1 for line in svc.log if f"loading {model} (needs" in line)


def test_concurrent_sdk_requests_on_an_unloaded_model_are_served_after_one_load(svc: Service) -> None:
    assert MODEL not in svc.health()["workers"]  # listed, not loaded at start
    started = time.monotonic()
    answers = concurrently(four_requests(svc))
    elapsed = time.monotonic() - started
    assert all(isinstance(a, str) for a in answers.values()), answers
    assert all("Paris" in a for a in answers.values()), answers
    assert num_loads(svc, MODEL) == 1, svc.log_text()[-3000:]
    assert svc.health()["workers"][MODEL]["state"] == "ready"
    print(f"4 concurrent requests on an unloaded model: all served in {elapsed:.1f} s")


def test_a_stream_sends_keepalives_while_its_model_loads(svc: Service) -> None:
    """Raw bytes (the SDKs hide them): the 200 starts at once, keep-alives follow."""
    httpx.post(f"{svc.base_url}/admin/models/{MODEL}/unload", timeout=60).raise_for_status()
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{svc.base_url}/v1/chat/completions", json=body, timeout=300) as answer:
        assert answer.status_code == 200
        assert svc.health()["workers"][MODEL]["state"] == "loading"  # the answer started before the model
        seen = b"".join(answer.iter_bytes())
    assert seen.count(b": keep-alive") >= 1 and seen.endswith(b"data: [DONE]\n\n"), seen[:400]


def wait_until_not_ready(svc: Service, model: str) -> None:
    deadline = time.monotonic() + 60
    while svc.health()["workers"][model]["state"] == "ready":
        assert time.monotonic() < deadline, "the worker never left ready"
        time.sleep(0.01)


@pytest.mark.parametrize("how", ["admin restart", "SIGKILL"])
def test_requests_during_a_worker_restart_wait_and_are_served(svc: Service, how: str) -> None:
    httpx.post(f"{svc.base_url}/admin/models/{MODEL}/load", timeout=300).raise_for_status()
    before = svc.health()["workers"][MODEL]
    if how == "SIGKILL":
        os.kill(before["pid"], signal.SIGKILL)
    else:
        threading.Thread(target=lambda: httpx.post(f"{svc.base_url}/admin/workers/{MODEL}/restart",
                                                   timeout=300), daemon=True).start()
    wait_until_not_ready(svc, MODEL)
    calls = four_requests(svc)
    answers = concurrently({name: calls[name] for name in ("chat", "messages-streamed")})
    assert all(isinstance(a, str) and "Paris" in a for a in answers.values()), answers
    after = svc.health()["workers"][MODEL]
    assert after["state"] == "ready" and after["pid"] != before["pid"] and after["restarts"] > before["restarts"]


def test_a_model_whose_load_fails_answers_every_waiter_a_clear_503_at_once(
        models_dir: Path, tmp_path: Path) -> None:
    # a keep-alive interval longer than the failing load takes (a few seconds; more on a
    # busy machine): the failure comes before any answer started, so as an HTTP status
    svc = start(models_dir, tmp_path / "home", "--load-timeout-s", "300", "--sse-keepalive-s", "60")
    try:
        oa, an = clients(svc)
        calls = {
            "chat": lambda: oa.chat.completions.create(model=BROKEN, messages=QUESTION, max_tokens=4),
            "chat-streamed": lambda: list(oa.chat.completions.create(model=BROKEN, messages=QUESTION,
                                                                     max_tokens=4, stream=True)),
            "messages": lambda: an.messages.create(model=BROKEN, messages=QUESTION, max_tokens=4),
        }
        started = time.monotonic()
        errors = concurrently(calls)
        elapsed = time.monotonic() - started
        assert elapsed < 60, "a failed load must answer at once, not after load_timeout_s (300 s)"
        for name, error in errors.items():
            assert isinstance(error, (openai.APIStatusError, anthropic.APIStatusError)), (name, error)
            assert error.status_code == 503, (name, error)
            assert f"model '{BROKEN}' is unavailable: its load failed" in str(error.body), (name, error.body)
        assert errors["chat"].body["code"] == "model_load_failed"
        assert errors["messages"].body["error"]["type"] == "api_error"  # Anthropic's shape on its route
        assert num_loads(svc, BROKEN) == 1, svc.log_text()[-3000:]
        print(f"a failed load answered 3 waiters in {elapsed:.1f} s")
    finally:
        svc.stop()


def test_a_wait_past_load_timeout_s_answers_a_503(models_dir: Path, tmp_path: Path) -> None:
    svc = start(models_dir, tmp_path / "home")
    try:
        # a bound far below what a load takes, set after the start (the start's own load needs more)
        (svc.home / "config.toml").write_text("load_timeout_s = 1.0\n")
        httpx.post(f"{svc.base_url}/admin/reload", timeout=30).raise_for_status()
        oa, _ = clients(svc)
        ask = lambda: oa.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4)  # noqa: E731
        started = time.monotonic()
        errors = concurrently({"first": ask, "second": ask})
        elapsed = time.monotonic() - started
        assert elapsed < 30, errors
        for error in errors.values():  # the second waited too, rather than a "still loading" 503
            assert isinstance(error, openai.APIStatusError) and error.status_code == 503, error
            message = json.dumps(error.body)
            assert "load-timeout-s" in message or "load_timeout_s" in message, message
        assert num_loads(svc, MODEL) == 1
    finally:
        svc.stop()


def test_a_request_during_the_start_waits_with_keepalives(models_dir: Path, tmp_path: Path) -> None:
    """The port opens before the command-line model is loaded: /health says `starting`, and a
    request sent then starts its answer and waits for the model like any other."""
    svc = Service(["--model-dir", str(models_dir), "--model", MODEL, "--no-cold-tier", "--sse-keepalive-s", "0.5"],
                  home=tmp_path / "home")
    try:
        deadline = time.monotonic() + 60
        while True:
            assert svc.proc.poll() is None and time.monotonic() < deadline, svc.log_text()[-3000:]
            try:
                if httpx.get(f"{svc.base_url}/health", timeout=2).json().get("status") == "starting":
                    break
            except (httpx.HTTPError, ValueError):
                time.sleep(0.05)
        body = {"model": MODEL, "messages": QUESTION, "max_tokens": 8, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{svc.base_url}/v1/chat/completions", json=body, timeout=300) as answer:
            assert answer.status_code == 200
            assert svc.health()["status"] == "starting"  # the answer started before the start finished
            seen = b"".join(answer.iter_bytes())
        assert b": keep-alive" in seen and seen.endswith(b"data: [DONE]\n\n"), seen[:400]
        text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                       for line in seen.decode().splitlines() if line.startswith("data: {"))
        assert "Paris" in text, text
        assert svc.health()["status"] == "ok"
    finally:
        svc.stop()
