"""The kvstore supervisor pings a real kvstore process: one that stops answering (SIGSTOP)
is killed as hung and restarted; one that is only paused for less than the timeout is not."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from router.config import make_config
from router.kvstore_supervisor import KVStoreSupervisor

pytestmark = pytest.mark.timeout(60)

TIMEOUT_S = 1.0


def run_with_kvstore(tmp_path: Path, body: Callable[[KVStoreSupervisor], Awaitable[None]]) -> None:
    config = make_config({"home": str(tmp_path / "home"), "heartbeat_s": 0.1, "kvstore_ping_timeout_s": TIMEOUT_S,
                          "restart_backoff_s": 0.2, "max_disk_bytes": 64 << 20, "segment_bytes": 4 << 20})

    async def main() -> None:
        supervisor = KVStoreSupervisor(config, Path(tempfile.mkdtemp(prefix="kvs-", dir="/tmp")))
        await supervisor.start()
        pid = supervisor.child.pid if supervisor.child else 0
        try:
            await body(supervisor)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            await supervisor.stop()

    asyncio.run(main())


async def wait_for(predicate: Callable[[], bool], timeout_s: float) -> float:
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout_s
        await asyncio.sleep(0.02)
    return time.monotonic() - started


def test_a_stopped_kvstore_is_killed_as_hung_and_restarted(tmp_path: Path) -> None:
    async def body(supervisor: KVStoreSupervisor) -> None:
        await asyncio.sleep(0.3)
        health = supervisor.health()
        assert health["state"] == "ready" and health["last_ping_s"] < 0.3
        pid = health["pid"]
        os.kill(pid, signal.SIGSTOP)
        elapsed = await wait_for(lambda: supervisor.health()["pid"] != pid, TIMEOUT_S + 3)
        # silence counts from its last answer, up to a heartbeat (0.1 s) before the stop
        assert TIMEOUT_S - 0.15 <= elapsed < TIMEOUT_S + 1.0
        assert "did not answer pings" in supervisor.last_error and "killed as hung" in supervisor.last_error
        await wait_for(lambda: supervisor.state == "ready", 10)
        health = supervisor.health()
        assert health["pid"] not in (None, pid) and health["restarts"] == 1
        await asyncio.sleep(0.3)
        assert supervisor.health()["last_ping_s"] < 0.3  # the new one answers
        assert await supervisor.stats() is not None

    run_with_kvstore(tmp_path, body)


def test_a_kvstore_paused_for_less_than_the_timeout_is_not_killed(tmp_path: Path) -> None:
    async def body(supervisor: KVStoreSupervisor) -> None:
        await asyncio.sleep(0.3)
        pid = supervisor.health()["pid"]
        os.kill(pid, signal.SIGSTOP)
        await asyncio.sleep(0.6 * TIMEOUT_S)
        assert supervisor.health()["last_ping_s"] >= 0.5 * TIMEOUT_S  # silent, and shown as such
        os.kill(pid, signal.SIGCONT)
        await asyncio.sleep(TIMEOUT_S)
        health = supervisor.health()
        assert (health["state"], health["pid"], health["restarts"]) == ("ready", pid, 0)
        assert health["last_ping_s"] < 0.3

    run_with_kvstore(tmp_path, body)
