"""Keeps the kvstore process (the SSD cold tier shared by all workers) running.

The kvstore binds its own socket; workers connect to it directly. The router only starts
it before the workers, pings it, restarts it with backoff if it dies or stops answering
(workers treat it as a miss meanwhile and ZeroMQ reconnects them), asks it for stats, and
stops it last so pending writes reach the disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import sys
import time
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from protocol.codec import decode, encode
from protocol.errors import ProtocolError
from protocol.log_format import LOG_LEVEL_ENV
from protocol.messages import KVStats, KVStatsResult
from protocol.sockets import ipc_address, make_socket
from router.child_process import ChildProcess, describe_exit
from router.config import RouterConfig

logger = logging.getLogger(__name__)

_STARTUP_TIMEOUT_S = 60.0


class KVStoreStartupError(RuntimeError):
    """The kvstore died or hung before binding its socket (its output tail included)."""


class KVStoreSupervisor:
    """One kvstore child: spawn, watch, restart, stop.

    `address` is fixed for the router's life (a path in the private runtime dir), so a
    restarted kvstore is found again by every worker without telling them.

    States: `starting`, `ready`, `hung` (silent for kvstore_ping_timeout_s: being killed),
    `restarting` (dead or killed, a new one is on its way), `down` (its first start
    failed), `stopped`. Its exit is seen at once; a hang through pings (KVStats) sent every
    heartbeat_s, since a kvstore that is alive but stuck costs every worker a read timeout.
    """

    def __init__(self, config: RouterConfig, runtime_dir: Path) -> None:
        self.config = config
        self.address = ipc_address(runtime_dir, "kvstore")
        self._socket_path = Path(self.address.removeprefix("ipc://"))
        self.root = config.kv_cache_dir
        self.child: ChildProcess | None = None
        self.state = "stopped"
        self.num_restarts = 0
        self.last_error: str | None = None
        self._last_answer: float | None = None  # monotonic time of the live kvstore's last ping answer
        self._watcher: asyncio.Task[None] | None = None
        self._stopping = False
        self._ids = itertools.count(1)
        self._context = zmq.asyncio.Context.instance()
        self._query_lock = asyncio.Lock()

    def _argv(self) -> list[str]:
        c = self.config
        argv = [sys.executable, "-m", "kvstore", "--bind", self.address, "--root", str(self.root),
                "--max-disk-bytes", str(c.max_disk_bytes), "--segment-bytes", str(c.segment_bytes),
                "--compression", c.compression]
        for name, settings in c.models.items():  # per-model caps ([models."NAME"] max_disk_bytes)
            if settings.max_disk_bytes:
                argv += ["--namespace-cap", f"{name}={settings.max_disk_bytes}"]
        return argv

    async def start(self) -> None:
        """Spawn it and wait until its socket is bound (or it died: then raise)."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)  # an old one: the kvstore fixes its modes
        await self._spawn()
        self._watcher = asyncio.create_task(self._watch())

    async def _spawn(self) -> None:
        self._socket_path.unlink(missing_ok=True)
        self.state = "starting"
        self.child = ChildProcess(self._argv(), label="kvstore", env={LOG_LEVEL_ENV: self.config.log_level})
        deadline = time.monotonic() + _STARTUP_TIMEOUT_S
        while not self._socket_path.exists():
            if self.child.exited.done():
                tail = await self.child.output_tail()
                self.state = "down"
                self.last_error = f"kvstore {describe_exit(self.child.exited.result())}"
                raise KVStoreStartupError(f"{self.last_error}:\n{tail}")
            if time.monotonic() > deadline:
                self.child.kill()
                raise KVStoreStartupError(f"kvstore did not bind {self.address} within {_STARTUP_TIMEOUT_S:.0f} s")
            await asyncio.sleep(0.05)
        self.state = "ready"
        logger.info("kvstore ready (pid %d): %s, cap %.1f GB", self.child.pid, self.root,
                    self.config.max_disk_bytes / 1e9)

    async def _watch(self) -> None:
        delay = self.config.restart_backoff_s
        while not self._stopping:
            assert self.child is not None
            reason = await self._ping_until_gone(self.child)
            if self._stopping:
                return
            self.state = "restarting"
            self.last_error = reason
            logger.warning("%s; restarting in %.1f s (workers miss the SSD tier meanwhile)", self.last_error, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.config.restart_backoff_max_s)
            try:
                await self._spawn()
                self.num_restarts += 1
            except RuntimeError as exc:
                logger.error("kvstore restart failed: %s", exc)

    async def _ping_until_gone(self, child: ChildProcess) -> str:
        """Ping `child` every heartbeat_s until it exits, or kill it once it has not answered
        for kvstore_ping_timeout_s; returns why it is gone (for `last_error`)."""
        timeout_s = self.config.kvstore_ping_timeout_s
        sock = make_socket(self._context, zmq.DEALER, self.address, bind=False)
        self._last_answer = time.monotonic()  # it just bound its socket
        try:
            while not child.exited.done():
                with contextlib.suppress(zmq.Again):  # a hung kvstore's socket fills up: the silence counts
                    await sock.send_multipart(encode(KVStats(next(self._ids))), flags=zmq.NOBLOCK)
                await self._note_answers(sock, child, self.config.heartbeat_s)
                silent_s = time.monotonic() - self._last_answer
                if silent_s > timeout_s and not child.exited.done():
                    self.state = "hung"
                    self.last_error = (f"kvstore (pid {child.pid}) did not answer pings for {silent_s:.1f} s and "
                                       f"was killed as hung (timeout {timeout_s:g} s, --kvstore-ping-timeout-s)")
                    child.kill()
                    await asyncio.shield(child.exited)
                    return self.last_error
            return f"kvstore {describe_exit(child.exited.result())}"
        finally:
            self._last_answer = None
            sock.close(linger=0)

    async def _note_answers(self, sock: zmq.asyncio.Socket, child: ChildProcess, wait_s: float) -> None:
        """For `wait_s`, or until `child` exits, note when ping answers arrive (any answer
        counts, however late: it shows the loop is moving)."""
        deadline = time.monotonic() + wait_s
        while (left := deadline - time.monotonic()) > 0 and not child.exited.done():
            readable = asyncio.ensure_future(sock.poll(int(left * 1000) + 1))
            try:
                await asyncio.wait({readable, child.exited}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                readable.cancel()
            if readable.done() and not readable.cancelled() and readable.result():
                with contextlib.suppress(ProtocolError):
                    answer, _ = decode(await sock.recv_multipart())
                    if isinstance(answer, KVStatsResult):
                        self._last_answer = time.monotonic()

    async def stats(self, timeout_s: float = 1.0) -> dict[str, Any] | None:
        """The kvstore's own counters, or None if it does not answer in time."""
        if self.state != "ready":
            return None
        async with self._query_lock:
            sock = make_socket(self._context, zmq.DEALER, self.address, bind=False)
            try:
                request_id = next(self._ids)
                await sock.send_multipart(encode(KVStats(request_id)))
                deadline = time.monotonic() + timeout_s
                while (left := deadline - time.monotonic()) > 0:
                    if not await sock.poll(int(left * 1000) + 1):
                        break
                    with contextlib.suppress(ProtocolError):
                        answer, _ = decode(await sock.recv_multipart())
                        if isinstance(answer, KVStatsResult) and answer.request_id == request_id:
                            return answer.stats
                return None
            finally:
                sock.close(linger=0)

    def health(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "pid": self.child.live_pid if self.child is not None else None,
            "restarts": self.num_restarts,
            "last_error": self.last_error,
            # seconds since the running kvstore last answered a ping (None: none is running)
            "last_ping_s": round(time.monotonic() - self._last_answer, 1) if self._last_answer is not None else None,
            "root": str(self.root),
        }

    async def stop(self) -> None:
        """SIGTERM (it flushes pending writes and syncs its index), then SIGKILL."""
        self._stopping = True
        if self._watcher is not None:
            self._watcher.cancel()
        if self.child is not None:
            await self.child.stop(max(self.config.kill_after_s, 10.0))
        self.state = "stopped"
