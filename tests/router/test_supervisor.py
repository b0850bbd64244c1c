"""router.children.supervisor: startup failures fail fast, dead or hung workers fail their requests at
once and are restarted with backoff, and shutdown ends every child."""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import time
from pathlib import Path

import httpx
import pytest

from router.config import make_config
from router.children.pool import WorkerPool
from router.children.supervisor import WorkerStartupError
from tests.router.router_harness import FAST, FAKE_WORKER, MODEL_ID, RunningRouter, start_router

pytestmark = pytest.mark.timeout(60)


def chat(content: str, **fields: object) -> dict[str, object]:
    return {"model": MODEL_ID, "messages": [{"role": "user", "content": content}], **fields}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("mode, overrides, message", [
    ("die", {}, "exited before it was ready (exit code 7)"),
    ("fail", {}, "failed to start: no weights in that directory (fake)"),
    ("old_protocol", {}, "protocol version"),
    ("slow", {"load_timeout_s": 1.0}, "not ready within 1 s"),
])
def test_startup_failure_is_fast_and_clear(model_dir: Path, monkeypatch: pytest.MonkeyPatch, mode: str,
                                           overrides: dict[str, float], message: str) -> None:
    monkeypatch.setenv("FAKE_WORKER_START", mode)
    pool = WorkerPool(make_config({**FAST, **overrides}), {MODEL_ID: model_dir}, FAKE_WORKER)
    started = time.monotonic()
    with pytest.raises(WorkerStartupError, match=re.escape(message)) as err:
        asyncio.run(pool.start())
    assert time.monotonic() - started < 5
    if mode == "die":  # the log tail travels with the error
        assert "about to die before READY" in str(err.value)
    supervisor = pool.supervisors[MODEL_ID]
    assert supervisor.state == "down" and message.split(" (")[0] in supervisor.last_error
    assert supervisor.child is not None and not pid_alive(supervisor.child.pid)
    assert pool.runtime_dir is not None and not pool.runtime_dir.exists()


def test_crash_mid_request_fails_it_and_restarts(router: RunningRouter) -> None:
    old_pid = router.supervisor.health()["pid"]
    with router.client() as client:
        response = client.post("/v1/chat/completions", json=chat("CRASH"))
        assert response.status_code == 503
        error = response.json()["error"]
        assert error["code"] == "worker_unavailable" and "exit code 3" in error["message"]
        assert response.headers["retry-after"]
        router.wait_for(lambda: router.supervisor.state == "ready")
        health = client.get("/health").json()["workers"][MODEL_ID]
        assert health["restarts"] == 1 and health["pid"] != old_pid and "exit code 3" in health["last_error"]
        assert client.post("/v1/chat/completions", json=chat("hi")).status_code == 200


def test_crash_mid_stream_sends_an_error_event(router: RunningRouter) -> None:
    with router.client() as client, client.stream("POST", "/v1/chat/completions",
                                                   json=chat("CRASH", stream=True)) as response:
        assert response.status_code == 200
        data = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert "[DONE]" not in data
    contents = [json.loads(d)["choices"][0]["delta"].get("content") for d in data[:-1]]
    assert contents == ["", "Hello", " from"]
    assert json.loads(data[-1])["error"]["code"] == "worker_unavailable"


def test_requests_while_restarting_wait_and_are_served(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a long backoff keeps the worker down long enough to look at
    for running in start_router(model_dir, monkeypatch, restart_backoff_s=3.0, restart_backoff_max_s=3.0):
        with running.client() as client:
            assert client.post("/v1/chat/completions", json=chat("CRASH")).status_code == 503
            health = client.get("/health")
            assert health.status_code == 503 and health.json()["status"] == "degraded"
            assert health.json()["workers"][MODEL_ID]["state"] == "restarting"
            assert health.json()["workers"][MODEL_ID]["pid"] is None
            answers: dict[bool, httpx.Response] = {}

            def ask(stream: bool) -> None:
                with running.client() as own:
                    answers[stream] = own.post("/v1/chat/completions", json=chat("hi", stream=stream))

            started = time.monotonic()
            askers = [threading.Thread(target=ask, args=(stream,)) for stream in (False, True)]
            for asker in askers:
                asker.start()
            for asker in askers:
                asker.join(30)
            assert time.monotonic() - started > 1  # they waited for the restart, not refused
            whole, streamed = answers[False], answers[True]
            assert whole.status_code == 200 and whole.content.startswith(b" "), whole.text  # padded while waiting
            assert whole.json()["choices"][0]["message"]["content"]
            assert streamed.status_code == 200 and b": keep-alive" in streamed.content, streamed.text
            assert b"data: [DONE]" in streamed.content and b'"content":"Hello"' in streamed.content
            assert client.get("/health").status_code == 200


def test_hung_worker_is_killed_and_replaced(router: RunningRouter) -> None:
    hung_pid = router.supervisor.health()["pid"]
    started = time.monotonic()
    with router.client() as client:
        response = client.post("/v1/chat/completions", json=chat("HANG"))
    # the harness's keep-alive (0.3 s) is shorter than its ping timeout (1 s): the padded
    # 200 body has started by the time the worker is declared hung, so the error is in it
    assert response.status_code == 200 and response.content.startswith(b" ")
    assert "did not answer pings" in response.json()["error"]["message"]
    assert time.monotonic() - started < 5  # ping_timeout_s is 1 s here
    router.wait_for(lambda: not pid_alive(hung_pid))
    router.wait_for(lambda: router.supervisor.state == "ready")
    assert router.supervisor.num_restarts == 1


def test_crash_loop_gives_up_and_reports_down(model_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    mode_file = tmp_path / "mode"
    for running in start_router(model_dir, monkeypatch, worker_env={"FAKE_WORKER_START_FILE": str(mode_file)},
                                max_start_failures=2):
        mode_file.write_text("die")  # every restart from now on dies before READY
        with running.client() as client:
            assert client.post("/v1/chat/completions", json=chat("CRASH")).status_code == 503
            running.wait_for(lambda: running.supervisor.state == "down")
            health = client.get("/health").json()["workers"][MODEL_ID]
            assert health["state"] == "down" and "exit code 7" in health["last_error"]
            response = client.post("/v1/chat/completions", json=chat("hi"))  # one fresh load, which dies too
            # a 503, or (the load outlasting a keep-alive interval) the padded 200 carrying it
            assert response.status_code == 503 or response.content.startswith(b" "), response.text
            assert "unavailable: its load failed" in response.json()["error"]["message"]


def test_backoff_doubles_up_to_its_cap(model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                       caplog: pytest.LogCaptureFixture) -> None:
    mode_file = tmp_path / "mode"
    caplog.set_level("WARNING", logger="router.children.supervisor")
    for running in start_router(model_dir, monkeypatch, worker_env={"FAKE_WORKER_START_FILE": str(mode_file)},
                                restart_backoff_s=0.1, restart_backoff_max_s=0.4, max_start_failures=4):
        mode_file.write_text("die")
        with running.client() as client:
            client.post("/v1/chat/completions", json=chat("CRASH"))
        running.wait_for(lambda: running.supervisor.state == "down")
    delays = [r.getMessage().rsplit(" in ", 1)[1] for r in caplog.records if "restarting worker" in r.getMessage()]
    assert delays == ["0.1 s", "0.2 s", "0.4 s", "0.4 s"]


def test_stop_ends_every_child_and_removes_the_runtime_dir(model_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    pids, runtime_dirs = [], []
    for running in start_router(model_dir, monkeypatch):
        pids.append(running.supervisor.health()["pid"])
        runtime_dirs.append(running.pool.runtime_dir)
    assert not pid_alive(pids[0]) and not runtime_dirs[0].exists()
    assert "fake worker: shutdown" in caplog.text  # it was asked to drain, not just killed


def test_stop_kills_a_worker_that_ignores_shutdown(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pids = []
    for running in start_router(model_dir, monkeypatch, ping_timeout_s=30.0):
        pids.append(running.supervisor.health()["pid"])
        client = httpx.Client(base_url=running.url, timeout=5)
        # the worker is now stuck in time.sleep; hang up at the first keep-alive byte
        with client.stream("POST", "/v1/chat/completions", json=chat("HANG")) as response:
            assert next(response.iter_bytes()).strip() == b""
        client.close()
        started = time.monotonic()
    assert time.monotonic() - started < 6
    assert not pid_alive(pids[0])


def test_shutdown_ends_in_flight_streams_with_an_error_event(model_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    for running in start_router(model_dir, monkeypatch, worker_env={"FAKE_WORKER_SLOW_S": "30"}):
        with running.client() as client, client.stream("POST", "/v1/chat/completions",
                                                       json=chat("SLOW", stream=True)) as response:
            data = []
            for line in response.iter_lines():
                if line == ": keep-alive" and not running.server.should_exit:
                    running.server.should_exit = True  # what SIGTERM does
                if line.startswith("data: "):
                    data.append(json.loads(line[len("data: "):]))
        assert "shutting down" in data[-1]["error"]["message"]
    # the worker was told to drop it (a worker ignoring that would delay shutdown by its own drain)
    assert "fake worker: aborted chatcmpl-" in caplog.text

