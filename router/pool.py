"""Which models this router serves, each kept alive by one `WorkerSupervisor`.

Today every configured model is loaded at start and kept; this is the seam where
loading on demand, LRU eviction under a memory budget, TTLs and pins will live.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from protocol.errors import RequestError, WorkerDead
from protocol.sockets import ipc_address, make_runtime_dir
from router.config import RouterConfig
from router.kvstore_supervisor import KVStoreSupervisor
from router.supervisor import DEFAULT_WORKER_COMMAND, WorkerSupervisor
from router.worker_client import WorkerClient

logger = logging.getLogger(__name__)


class WorkerPool:
    """model_id -> supervised worker, plus the runtime dir and socket they share.

    `start()` and `stop()` are idempotent, so the CLI can start the pool before uvicorn
    binds its port and the app's lifespan can still own the pool in tests.
    """

    def __init__(self, config: RouterConfig, models: Mapping[str, Path],
                 worker_command: Sequence[str] = DEFAULT_WORKER_COMMAND) -> None:
        if not models:
            raise ValueError("a WorkerPool needs at least one model")
        self.config = config
        self.models = dict(models)
        self.worker_command = tuple(worker_command)
        self.created = int(time.time())
        self.supervisors: dict[str, WorkerSupervisor] = {}
        self.runtime_dir: Path | None = None
        self.client: WorkerClient | None = None
        self.kvstore: KVStoreSupervisor | None = None
        self._started = False

    async def start(self) -> None:
        """Spawn every worker and wait until all are READY (raises WorkerStartupError)."""
        if self._started:
            return
        self._started = True
        self.runtime_dir = make_runtime_dir()
        self.client = WorkerClient(ipc_address(self.runtime_dir, "workers"))
        await self.client.start()
        self.supervisors = {
            model_id: WorkerSupervisor(model_id, path, self.config, self.client, self.worker_command)
            for model_id, path in self.models.items()
        }
        try:
            if self.config.cold_cache and self.config.prefix_cache:
                self.kvstore = KVStoreSupervisor(self.config, self.runtime_dir)
                await self.kvstore.start()
                for supervisor in self.supervisors.values():
                    supervisor.kvstore_address = self.kvstore.address
            await asyncio.gather(*(s.start() for s in self.supervisors.values()))
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Shut every worker down (drain, SIGTERM, SIGKILL) and remove the runtime dir."""
        if not self._started:
            return
        self._started = False
        await asyncio.gather(*(s.stop() for s in self.supervisors.values()), return_exceptions=True)
        if self.kvstore is not None:  # last: the workers' final writes must reach it
            await self.kvstore.stop()
        if self.client is not None:
            await self.client.close()
        if self.runtime_dir is not None:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)
        logger.info("all workers stopped")

    async def drain(self, timeout_s: float) -> None:
        """Let in-flight requests finish for up to `timeout_s`, then fail the rest."""
        if self.client is None:
            return
        deadline = time.monotonic() + timeout_s
        while self.client.num_open_requests() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        num_failed = self.client.fail_requests(None, WorkerDead("the server is shutting down; retry shortly"),
                                               abort=True)
        if num_failed:
            logger.warning("shutting down; ended %d unfinished request(s)", num_failed)

    def get(self, model_id: str) -> WorkerSupervisor:
        """The supervisor serving `model_id`; a 404 `model_not_found` if there is none."""
        supervisor = self.supervisors.get(model_id)
        if supervisor is None and model_id in self.models:
            raise WorkerDead(f"model '{model_id}' is not started yet; retry shortly")
        if supervisor is None:
            available = ", ".join(sorted(self.models)) or "none"
            raise RequestError(f"The model '{model_id}' does not exist. Available models: {available}",
                               status=404, param="model", code="model_not_found")
        return supervisor

    def is_healthy(self) -> bool:
        return bool(self.supervisors) and all(s.state == "ready" for s in self.supervisors.values())

    def health(self) -> dict[str, Any]:
        health = {
            "status": "ok" if self.is_healthy() else "degraded",
            "workers": {model_id: s.health() for model_id, s in self.supervisors.items()},
        }
        if self.kvstore is not None:
            health["kvstore"] = self.kvstore.health()
        return health
