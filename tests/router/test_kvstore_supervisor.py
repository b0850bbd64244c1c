"""The kvstore supervisor pings a real kvstore process: one that stops answering (SIGSTOP)
is killed as hung and restarted; one that is only paused for less than the timeout is not.
A child that answers the handshake as something else, or for another protocol version,
fails its start with an error that says so."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import zmq

from protocol.codec import decode, encode
from protocol.messages import PROTOCOL_VERSION, Hello, KVStoreConfig, StartupFailed
from protocol.settings import KVStoreSettings
from protocol.sockets import ipc_address, make_runtime_dir, make_socket
from router.config import RouterConfig, make_config
from router.children.kvstore_supervisor import KVStoreStartupError, KVStoreSupervisor
from router.children.worker_client import WorkerClient
from tests.kvstore.helpers import REPO

pytestmark = pytest.mark.timeout(60)

TIMEOUT_S = 1.0


def fast_config(tmp_path: Path) -> RouterConfig:
    return make_config({"home": str(tmp_path / "home"), "heartbeat_s": 0.1, "kvstore_ping_timeout_s": TIMEOUT_S,
                        "restart_backoff_s": 0.2, "max_disk_bytes": 64 << 20, "segment_bytes": 4 << 20})


def run_with_kvstore(tmp_path: Path, body: Callable[[KVStoreSupervisor], Awaitable[None]]) -> None:
    config = fast_config(tmp_path)

    async def main() -> None:
        runtime = Path(tempfile.mkdtemp(prefix="kvs-", dir="/tmp"))
        client = WorkerClient(ipc_address(runtime, "workers"))
        await client.start()
        supervisor = KVStoreSupervisor(config, runtime, client)
        try:
            await supervisor.start()
            pid = supervisor.child.pid if supervisor.child else 0
            try:
                await body(supervisor)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        finally:
            await supervisor.stop()
            await client.close()

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


# a child that connects like a kvstore and says Hello with the given fields, then waits
IMPOSTOR = """
import os, sys, time, zmq
sys.path.insert(0, {repo!r})
from protocol.codec import encode
from protocol.messages import Hello
socket = zmq.Context().socket(zmq.DEALER)
socket.setsockopt(zmq.IDENTITY, sys.argv[sys.argv.index("--identity") + 1].encode())
socket.connect(sys.argv[sys.argv.index("--connect") + 1])
socket.send_multipart(encode(Hello({version}, {role!r}, os.getpid())))
time.sleep(30)
"""


@pytest.mark.parametrize("version, role, message", [
    (PROTOCOL_VERSION, "worker", "a 'worker' process answered as kvstore, not a kvstore"),
    (PROTOCOL_VERSION + 1, "kvstore", f"speaks protocol version {PROTOCOL_VERSION + 1}, the router {PROTOCOL_VERSION}"),
])
def test_a_wrong_hello_fails_the_start_clearly(tmp_path: Path, version: int, role: str, message: str) -> None:
    command = (sys.executable, "-c", IMPOSTOR.format(repo=str(REPO), version=version, role=role))

    async def main() -> None:
        runtime = Path(tempfile.mkdtemp(prefix="kvs-", dir="/tmp"))
        client = WorkerClient(ipc_address(runtime, "workers"))
        await client.start()
        supervisor = KVStoreSupervisor(fast_config(tmp_path), runtime, client, command)
        try:
            started = time.monotonic()
            with pytest.raises(KVStoreStartupError, match=re.escape(message)):
                await supervisor.start()
            assert time.monotonic() - started < 5
            assert supervisor.state == "down" and message in (supervisor.last_error or "")
            assert supervisor.child is not None
            await asyncio.wait_for(supervisor.child.exited, 5)  # killed, not left behind
        finally:
            await supervisor.stop()
            await client.close()

    asyncio.run(main())


def test_a_kvstore_refuses_a_config_for_another_protocol_version(tmp_path: Path) -> None:
    """The kvstore's side of the check: it says why (StartupFailed) and exits 2."""
    runtime = make_runtime_dir("kvh-")
    address = ipc_address(runtime, "router")
    context = zmq.Context()
    router = make_socket(context, zmq.ROUTER, address, bind=True)
    child = subprocess.Popen([sys.executable, "-m", "kvstore", "--connect", address, "--identity", "kvstore#1"],
                             cwd=REPO, stderr=subprocess.PIPE)
    try:
        assert router.poll(15_000), "no hello from the kvstore"
        identity, *parts = router.recv_multipart()
        hello, _ = decode(parts)
        assert isinstance(hello, Hello) and (hello.role, hello.pid) == ("kvstore", child.pid)
        config = KVStoreConfig(PROTOCOL_VERSION + 1, str(tmp_path / "kv"), ipc_address(runtime, "kv"),
                               KVStoreSettings())
        router.send_multipart([identity, *encode(config)])
        assert router.poll(15_000), "no answer to a config of another protocol version"
        answer, _ = decode(router.recv_multipart()[1:])
        assert isinstance(answer, StartupFailed) and "protocol version" in answer.message
        assert child.wait(timeout=15) == 2
        assert not (tmp_path / "kv").exists()  # it opened nothing
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        router.close(linger=0)
        context.term()
        for path in runtime.iterdir():
            path.unlink()
        runtime.rmdir()


def test_stop_sends_shutdown_and_the_kvstore_exits_cleanly(tmp_path: Path) -> None:
    async def body(supervisor: KVStoreSupervisor) -> None:
        assert supervisor.ready is not None and supervisor.ready.root == str(supervisor.root)
        child = supervisor.child
        assert child is not None
        await supervisor.stop()
        assert child.exited.result() == 0  # Shutdown: flushed and exited, no signal needed
        assert supervisor.health()["state"] == "down"

    run_with_kvstore(tmp_path, body)
