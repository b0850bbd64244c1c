"""router.children.model_waits and router.pending_streams on fake workers: requests for a model that
is not ready wait for it (one load for all of them), with their route's keep-alives, and
only a failed load or a wait past load_timeout_s is an error."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from protocol.errors import RequestError
from router.children.model_waits import ModelWaits
from tests.router.router_harness import MODEL_ID, RunningRouter, start_router

pytestmark = pytest.mark.timeout(60)

ASK = [{"role": "user", "content": "hi"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
# one request per route and mode; each with what its answer must hold
REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"messages": ASK}),
    "chat-stream": ("/v1/chat/completions", {"messages": ASK, "stream": True}),
    "chat-tools": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "TOOLCALL?"}],
                                            "tools": [WEATHER]}),
    "messages-stream": ("/v1/messages", {"messages": ASK, "max_tokens": 16, "stream": True}),
    "messages": ("/v1/messages", {"messages": ASK, "max_tokens": 16}),
    "responses": ("/v1/responses", {"input": "hi"}),
    "responses-stream": ("/v1/responses", {"input": "hi", "stream": True}),
}


def ask_all(router: RunningRouter, names: list[str]) -> dict[str, httpx.Response]:
    """Send the named requests at once, each from its own thread; their answers."""
    answers: dict[str, httpx.Response] = {}

    def ask(name: str) -> None:
        path, body = REQUESTS[name]
        with router.client() as client:
            answers[name] = client.post(path, json={"model": MODEL_ID, **body})

    threads = [threading.Thread(target=ask, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(40)
    return answers


def num_loads(caplog: pytest.LogCaptureFixture) -> int:
    return sum(1 for r in caplog.records if r.name == "router.children.pool" and r.getMessage().startswith(f"loading {MODEL_ID}"))


def test_concurrent_requests_for_an_unloaded_model_start_one_load_and_are_all_served(
        model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="router.children.pool")
    for running in start_router(model_dir, monkeypatch, worker_env={"FAKE_WORKER_LOAD_S": "1.5"}, preload=False):
        assert MODEL_ID not in running.pool.supervisors
        answers = ask_all(running, list(REQUESTS))
        assert {name: a.status_code for name, a in answers.items()} == dict.fromkeys(REQUESTS, 200)
        assert num_loads(caplog) == 1
        whole = answers["chat"]
        assert whole.content.startswith(b" ")  # padded through the load (keep-alive 0.3 s, load 1.5 s)
        assert whole.json()["choices"][0]["message"]["content"] == "Hello from the fake worker ."
        assert b": keep-alive" in answers["chat-stream"].content and b"data: [DONE]" in answers["chat-stream"].content
        # the tool-call parser was made once the worker was known, and found both calls
        message = answers["chat-tools"].json()["choices"][0]["message"]
        assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather", "get_weather"]
        assert message["content"] == "I will check."
        events = answers["messages-stream"].text
        assert events.index("event: message_start") < events.index("event: ping") < events.index("event: message_stop")
        assert answers["messages"].json()["content"][0]["text"] == "Hello from the fake worker ."
        assert answers["responses"].json()["status"] == "completed"
        assert "response.in_progress" in answers["responses-stream"].text
        assert "response.completed" in answers["responses-stream"].text


def test_a_failed_load_answers_every_waiter_at_once(model_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="router.children.pool")
    # a long keep-alive interval: the failure comes before any answer started, as real statuses
    for running in start_router(model_dir, monkeypatch, worker_env={"FAKE_WORKER_START": "fail"}, preload=False,
                                sse_keepalive_s=20.0):
        started = time.monotonic()
        answers = ask_all(running, ["chat", "chat-stream", "messages-stream", "responses"])
        assert time.monotonic() - started < 10  # not after load_timeout_s (10 s here)
        assert {a.status_code for a in answers.values()} == {503}, {n: a.text for n, a in answers.items()}
        assert num_loads(caplog) == 1
        for name, answer in answers.items():
            message = answer.json()["error"]["message"]
            assert "its load failed" in message and "no weights in that directory (fake)" in message, name
        assert answers["chat"].json()["error"]["code"] == "model_load_failed"
        assert answers["messages-stream"].json()["type"] == "error"  # Anthropic's shape on its route


def test_a_failed_load_after_the_answer_started_comes_in_the_route_shape(
        model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for running in start_router(model_dir, monkeypatch, preload=False,
                                worker_env={"FAKE_WORKER_START": "fail", "FAKE_WORKER_LOAD_S": "1.5"}):
        answers = ask_all(running, ["chat", "chat-stream", "messages-stream", "responses-stream"])
        assert {a.status_code for a in answers.values()} == {200}  # started before the load failed
        whole = answers["chat"]
        assert whole.content.startswith(b" ") and "no weights in that directory" in whole.json()["error"]["message"]
        last = [line for line in answers["chat-stream"].text.splitlines() if line.startswith("data: ")][-1]
        assert json.loads(last[6:])["error"]["code"] == "model_load_failed"
        assert "event: error" in answers["messages-stream"].text
        assert "response.failed" in answers["responses-stream"].text


def test_a_request_during_a_load_queued_behind_the_bound_gets_a_503(
        model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wait is bounded by load_timeout_s from the request's arrival, whatever it waits for:
    here a restart whose backoff is longer than the bound."""
    for running in start_router(model_dir, monkeypatch, restart_backoff_s=30.0, load_timeout_s=2.0,
                                sse_keepalive_s=20.0):
        with running.client() as client:
            assert client.post("/v1/chat/completions", json={"model": MODEL_ID, "messages": [
                {"role": "user", "content": "CRASH"}]}).status_code == 503
            started = time.monotonic()
            answer = client.post("/v1/chat/completions", json={"model": MODEL_ID, "messages": ASK})
            assert 1.5 < time.monotonic() - started < 10
        error = answer.json()["error"]
        assert answer.status_code == 503 and error["code"] == "model_load_timeout", answer.text
        assert "load_timeout_s" in error["message"] and "restarting" in error["message"]


def test_a_client_gone_while_waiting_sends_nothing_to_the_worker(model_dir: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    for running in start_router(model_dir, monkeypatch, worker_env={"FAKE_WORKER_LOAD_S": "2"}, preload=False):
        body = {"model": MODEL_ID, "messages": ASK, "stream": True}
        with running.client() as client, client.stream("POST", "/v1/chat/completions", json=body) as stream:
            assert stream.status_code == 200
            next(stream.iter_raw())  # the answer started while the model loads; then hang up
            assert running.pool.waits.ready_now(MODEL_ID) is None
        running.wait_for(lambda: MODEL_ID in running.pool.supervisors
                         and running.pool.supervisors[MODEL_ID].state == "ready")  # the load went on
        time.sleep(0.5)
        assert running.pool.client is not None and running.pool.client.num_open_requests() == 0
        assert not running.pool.recent.get(MODEL_ID)  # no request ever reached the worker


# ---------------------------------------------------------------- ModelWaits alone


class FakePool:
    """What ModelWaits reads of a pool; `load` takes `load_s` and fails with `failure`."""

    def __init__(self, load_s: float = 0.2, failure: Exception | None = None, load_timeout_s: float = 5.0) -> None:
        self.config = SimpleNamespace(load_timeout_s=load_timeout_s)
        self.supervisors: dict[str, Any] = {}
        self.num_loads = 0
        self.load_s = load_s
        self.failure = failure

    async def load(self, model_id: str) -> Any:
        self.num_loads += 1
        supervisor = self.supervisors[model_id] = SimpleNamespace(state="loading", last_error=None)
        await asyncio.sleep(self.load_s)
        if self.failure is not None:
            supervisor.state, supervisor.last_error = "down", str(self.failure)
            raise self.failure
        supervisor.state = "ready"
        return supervisor

    def state_of(self, model_id: str) -> str:
        supervisor = self.supervisors.get(model_id)
        return supervisor.state if supervisor is not None else "unloaded"


def run_waits(pool: FakePool, body: Callable[[ModelWaits], Any]) -> Any:
    return asyncio.run(body(ModelWaits(pool)))  # type: ignore[arg-type]


def test_waiters_share_one_load_and_one_gone_stops_nothing() -> None:
    pool = FakePool()

    async def body(waits: ModelWaits) -> list[Any]:
        quitter = asyncio.ensure_future(waits.until_ready("m"))
        stayers = [asyncio.ensure_future(waits.until_ready("m")) for _ in range(5)]
        await asyncio.sleep(0.05)
        quitter.cancel()
        return await asyncio.gather(*stayers)

    supervisors = run_waits(pool, body)
    assert pool.num_loads == 1 and all(s.state == "ready" for s in supervisors)


def test_a_failed_load_fails_every_waiter_and_the_next_request_tries_again() -> None:
    from router.children.supervisor import WorkerStartupError

    pool = FakePool(failure=WorkerStartupError("bad weights"))

    async def body(waits: ModelWaits) -> list[Any]:
        first = await asyncio.gather(*(waits.until_ready("m") for _ in range(4)), return_exceptions=True)
        second = await asyncio.gather(waits.until_ready("m"), return_exceptions=True)
        return first + second

    errors = run_waits(pool, body)
    assert all(isinstance(e, RequestError) and e.status == 503 and "bad weights" in e.message for e in errors)
    assert pool.num_loads == 2  # one for the four together, one fresh attempt for the later one


def test_a_wait_past_the_bound_is_a_503_naming_it() -> None:
    pool = FakePool(load_s=5.0, load_timeout_s=0.3)

    async def body(waits: ModelWaits) -> Any:
        started = time.monotonic()
        with pytest.raises(RequestError) as err:
            await waits.until_ready("m")
        return err.value, time.monotonic() - started

    error, elapsed = run_waits(pool, body)
    assert 0.25 < elapsed < 2 and error.code == "model_load_timeout" and "load_timeout_s" in error.message
