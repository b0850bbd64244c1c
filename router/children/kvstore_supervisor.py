"""Keeps the kvstore process (the SSD cold tier shared by all workers) running.

It is supervised like a worker (`router.children.child_supervisor`): Hello -> `KVStoreConfig` ->
`KVStoreReady` over the router's worker socket, then pings. The kvstore binds its own
socket; workers connect to it directly, treat it as a miss while it is down, and ZeroMQ
reconnects them to the next one. The router also asks it for stats, and stops it last so
pending writes reach the disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import sys
import time
from pathlib import Path
from typing import Any, TypeVar

import zmq
import zmq.asyncio

from protocol.codec import decode, encode
from protocol.errors import ProtocolError
from protocol.messages import (
    KVSTORE_ROLE,
    PROTOCOL_VERSION,
    KVClear,
    KVClearResult,
    KVPin,
    KVPinResult,
    KVSnapshots,
    KVSnapshotsResult,
    KVStats,
    KVStatsResult,
    KVUnpin,
    KVUnpinResult,
    KVStoreConfig,
    KVStoreReady,
    Message,
)
from protocol.sockets import ipc_address, make_socket
from router.children.child_supervisor import ChildStartupError, ChildSupervisor
from router.config import RouterConfig
from router.children.worker_client import WorkerClient

logger = logging.getLogger(__name__)

DEFAULT_KVSTORE_COMMAND = (sys.executable, "-m", "kvstore")
_STARTUP_TIMEOUT_S = 60.0  # opening the store reads its index; a rebuild scans the segments
_FLUSH_S = 10.0  # at least this long to write and sync what is pending before SIGKILL

AnswerT = TypeVar("AnswerT", KVStatsResult, KVClearResult, KVPinResult, KVUnpinResult, KVSnapshotsResult)
Question = KVStats | KVClear | KVPin | KVUnpin | KVSnapshots


class KVStoreStartupError(ChildStartupError):
    """The kvstore died, failed or hung before it was ready (its output tail included)."""


class KVStoreSupervisor(ChildSupervisor):
    """One kvstore child, with the worker's lifecycle: spawn, handshake, watch, restart, stop.

    `address` is fixed for the router's life (a path in the private runtime dir), so a
    restarted kvstore is found again by every worker without telling them. A kvstore silent
    for kvstore_ping_timeout_s is killed as hung, since one that is alive but stuck costs
    every worker a read timeout.
    """

    role = KVSTORE_ROLE
    ready_type = KVStoreReady
    startup_error = KVStoreStartupError
    starting_state = "starting"

    def __init__(self, config: RouterConfig, runtime_dir: Path, client: WorkerClient,
                 command: tuple[str, ...] = DEFAULT_KVSTORE_COMMAND) -> None:
        super().__init__("kvstore", "kvstore", config, client)
        self.address = ipc_address(runtime_dir, "kvstore")
        self.root = config.kvstore_root
        self.command = command
        self.ready: KVStoreReady | None = None
        self._ids = itertools.count(1)
        self._context = zmq.asyncio.Context.instance()
        self._query_lock = asyncio.Lock()

    async def start(self) -> None:
        """Spawn it and return once it is ready (or raise `KVStoreStartupError`)."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)  # an old one: the kvstore fixes its modes
        await super().start()

    def health(self) -> dict[str, Any]:
        silent_s = self.seconds_since_heard()
        return {
            **super().health(),
            # seconds since the running kvstore last answered a ping (None: none is running)
            "last_ping_s": round(silent_s, 1) if silent_s is not None else None,
            "root": str(self.root),
        }

    async def stats(self, timeout_s: float = 1.0) -> dict[str, Any] | None:
        """The kvstore's own counters, or None if it does not answer in time."""
        async with self._query_lock:
            answer = await self._ask(KVStats(next(self._ids)), KVStatsResult, timeout_s)
        return answer.stats if answer is not None else None

    async def clear(self, namespace: str | None, timeout_s: float = 30.0) -> int | None:
        """Remove one namespace's blocks (a model's: workers store under their model id),
        or every block (None); how many, or None if the kvstore is not ready or does not
        answer in time. Outside the stats lock: a clear waits behind the writes queued
        before it, and /admin/status must not wait with it."""
        answer = await self._ask(KVClear(next(self._ids), namespace), KVClearResult, timeout_s)
        return answer.num_removed if answer is not None else None

    async def snapshots(self, namespace: str | None = None, timeout_s: float = 5.0) -> list[dict[str, Any]] | None:
        """The named snapshots (of one model, or all) with their keys and sizes on disk, or
        None if the kvstore does not answer."""
        answer = await self._ask(KVSnapshots(next(self._ids), namespace), KVSnapshotsResult, timeout_s)
        return answer.snapshots if answer is not None else None

    async def pin(self, name: str, namespace: str, keys: list[bytes], info: dict[str, Any],
                  timeout_s: float = 30.0) -> KVPinResult | None:
        """Pin `keys` under snapshot `name` (on disk before the answer; in order with the
        writes queued before it, so it may wait behind them), or None without an answer."""
        return await self._ask(KVPin(next(self._ids), name, namespace, keys, info), KVPinResult, timeout_s)

    async def unpin(self, name: str, timeout_s: float = 30.0) -> KVUnpinResult | None:
        """Drop snapshot `name` (its blocks stay, evictable again), or None without an answer."""
        return await self._ask(KVUnpin(next(self._ids), name), KVUnpinResult, timeout_s)

    async def _ask(self, question: Question, answer_type: type[AnswerT], timeout_s: float) -> AnswerT | None:
        """Send `question` on a socket of its own and wait for its answer (matched by
        request id), or None if the kvstore is not ready or silent for `timeout_s`."""
        if self.state != "ready":
            return None
        sock = make_socket(self._context, zmq.DEALER, self.address, bind=False)
        try:
            await sock.send_multipart(encode(question))
            deadline = time.monotonic() + timeout_s
            while (left := deadline - time.monotonic()) > 0:
                if not await sock.poll(int(left * 1000) + 1):
                    break
                with contextlib.suppress(ProtocolError):
                    answer, _ = decode(await sock.recv_multipart())
                    if isinstance(answer, answer_type) and answer.request_id == question.request_id:
                        return answer
            return None
        finally:
            sock.close(linger=0)

    # ---------------------------------------------------------------- the lifecycle's hooks

    def _argv(self, identity: str) -> list[str]:
        return [*self.command, "--connect", self.client.address, "--identity", identity]

    def _config_message(self) -> Message:
        caps = {name: settings.max_disk_bytes for name, settings in self.config.models.items()
                if settings.max_disk_bytes}  # [models."NAME"] max_disk_bytes
        return KVStoreConfig(PROTOCOL_VERSION, root=str(self.root), bind=self.address,
                             settings=self.config.kvstore, namespace_caps=caps)

    def _ping_timeout(self) -> tuple[float, str]:
        return self.config.kvstore_ping_timeout_s, "--kvstore-ping-timeout-s"

    @property
    def startup_timeout_s(self) -> float:
        return _STARTUP_TIMEOUT_S

    @property
    def startup_timeout_hint(self) -> str:
        return f"its store is {self.root}"

    @property
    def kill_after_s(self) -> float:
        return max(self.config.kill_after_s, _FLUSH_S)

    def _on_ready(self, ready: Message) -> None:
        assert isinstance(ready, KVStoreReady) and self.child is not None
        self.ready = ready
        logger.info("kvstore ready (pid %d): %s, %d blocks in %.1f GB, cap %.1f GB", self.child.pid, ready.root,
                    ready.num_blocks, ready.disk_bytes / 1e9, self.config.kvstore.max_disk_bytes / 1e9)
