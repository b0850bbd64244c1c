"""Test harness: a real router (uvicorn on a free port, in a thread) in front of fake workers."""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.config import make_config
from router.children.pool import WorkerPool
from router.server import RouterServer, make_server

FAKE_WORKER = (sys.executable, str(Path(__file__).with_name("fake_worker.py")))
MODEL_ID = "fake-model"

# fast supervision, so fault tests take a second, not a minute
FAST = {"heartbeat_s": 0.1, "ping_timeout_s": 1.0, "restart_backoff_s": 0.2, "restart_backoff_max_s": 0.5,
        "shutdown_drain_s": 0.5, "kill_after_s": 1.0, "load_timeout_s": 10.0, "sse_keepalive_s": 0.3}


@dataclass
class RunningRouter:
    url: str
    pool: WorkerPool
    server: RouterServer

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=20, **kwargs)

    def wait_for(self, predicate: Any, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError("condition not met in time")
            time.sleep(0.05)

    @property
    def supervisor(self) -> Any:
        return self.pool.supervisors[MODEL_ID]


def start_router(model_dir: Path, monkeypatch: pytest.MonkeyPatch, worker_env: dict[str, str] | None = None,
                 preload: bool = True, **overrides: Any) -> Iterator[RunningRouter]:
    """A router serving the fake model: loaded at start, or (`preload` False) registered as
    a command-line model is and loaded by its first request."""
    for key, value in (worker_env or {}).items():
        monkeypatch.setenv(key, value)
    # a home of its own: the router discovers models in HOME/models, and the user's
    # ~/.mlxd must not leak into these tests
    config = make_config({**FAST, "home": model_dir.parent / "home", **overrides})
    pool = WorkerPool(config, {MODEL_ID: model_dir}, worker_command=FAKE_WORKER)
    if not preload:
        pool.names.preload.clear()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = make_server(config, pool)
    loop = asyncio.new_event_loop()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            loop.run_until_complete(server.serve(sockets=[sock]))
        except BaseException as exc:  # surfaced by the fixture
            failure.append(exc)
        finally:
            loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, f"router did not start: {failure}"
    try:
        yield RunningRouter(f"http://127.0.0.1:{port}", pool, server)
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()
