"""A request waits for its model: through a load (on demand, at start, by an admin), a
restart, or a crash's restart, up to `load_timeout_s`, instead of being refused while the
worker is not ready. Only a load that fails, or a wait past the bound, is an error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from protocol.errors import RequestError
from router.config import RouterConfig
from router.children.supervisor import WorkerStartupError, WorkerSupervisor

logger = logging.getLogger(__name__)

POLL_S = 0.05  # how often a waiter looks at its model's state: the latency a waiter adds


class Models(Protocol):
    """What a wait needs of the pool (`router.children.pool.WorkerPool`)."""

    config: RouterConfig
    supervisors: dict[str, WorkerSupervisor]

    async def load(self, model_id: str) -> WorkerSupervisor: ...

    def state_of(self, model_id: str) -> str: ...


def load_failed(model_id: str, reason: str | None) -> RequestError:
    """The 503 for a model whose load failed: nothing a retry in a second will change."""
    return RequestError(f"model '{model_id}' is unavailable: its load failed: {reason or 'its worker stopped'}",
                        status=503, error_type="server_error", code="model_load_failed")


class ModelWaits:
    """Waits for models to become ready, and the loads that requests start.

    Invariants: requests start at most one load of a model at a time (every request that
    finds its model not loaded joins the load under way); a waiter that goes away (its
    client hung up) leaves the load running for the others and for the next request; a
    waiter ends with the ready worker, or with an error once the load or restart it waited
    through failed, or once `load_timeout_s` has passed since it began to wait.
    """

    def __init__(self, pool: Models) -> None:
        self.pool = pool
        self._loads: dict[str, asyncio.Future[WorkerSupervisor]] = {}

    def ready_now(self, model_id: str) -> WorkerSupervisor | None:
        """The model's worker if it can take a request at once (no wait)."""
        supervisor = self.pool.supervisors.get(model_id)
        return supervisor if supervisor is not None and supervisor.state == "ready" else None

    async def until_ready(self, model_id: str) -> WorkerSupervisor:
        """The model's ready worker, loading it if nobody is; raises a 503 RequestError if
        its load fails or it is not ready within `load_timeout_s`."""
        timeout_s = self.pool.config.load_timeout_s
        deadline = time.monotonic() + timeout_s
        watched: WorkerSupervisor | None = None  # the load or restart this request waits through
        while True:
            supervisor = self.pool.supervisors.get(model_id)
            if supervisor is not None and supervisor.state == "ready":
                return supervisor
            if supervisor is not None and supervisor is watched and supervisor.state == "down":
                raise load_failed(model_id, supervisor.last_error)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RequestError(
                    f"model '{model_id}' was not ready within {timeout_s:g} s (load_timeout_s); it is "
                    f"{self.pool.state_of(model_id)}. Retry later, or raise load_timeout_s if it is just slow to load",
                    status=503, error_type="server_error", code="model_load_timeout")
            if supervisor is None or supervisor.state == "down":
                await self._join_load(model_id, remaining)
            else:  # loading or restarting
                watched = supervisor
                await asyncio.sleep(min(POLL_S, remaining))

    async def _join_load(self, model_id: str, timeout_s: float) -> None:
        """Wait (up to `timeout_s`) for the load requests started, starting it if none is
        under way; raises `load_failed` if it fails."""
        load = self._loads.get(model_id)
        if load is None:
            load = self._loads[model_id] = asyncio.ensure_future(self.pool.load(model_id))
            load.add_done_callback(lambda done: self._forget(model_id, done))
        try:
            await asyncio.wait_for(asyncio.shield(load), timeout_s)  # shielded: a waiter gone stops no load
        except TimeoutError:
            return  # the caller's deadline has passed: it says so
        except WorkerStartupError as exc:
            raise load_failed(model_id, str(exc)) from None

    def _forget(self, model_id: str, load: asyncio.Future[WorkerSupervisor]) -> None:
        if self._loads.get(model_id) is load:
            del self._loads[model_id]
        if not load.cancelled() and load.exception() is not None:  # every waiter got it; none may be left
            logger.info("loading %s for waiting requests failed: %s", model_id, load.exception())
