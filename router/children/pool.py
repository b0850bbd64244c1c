"""Which models are loaded: lazy loading on first request, eviction under the memory
budget, pins, idle TTLs, and the kvstore all workers share.

The pool runs the lifecycle (load, unload, acquire, drain, stop); what a name means is
`router.children.model_names`' answer, and which model makes room is `router.children.memory_budget`'s.
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
from protocol.messages import FinishEvent
from protocol.locks import FileLock
from protocol.sockets import claim_runtime_dir, ipc_address
from router import model_registry
from router.config import RouterConfig
from router.children.kvstore_supervisor import KVStoreSupervisor
from router.metrics import HISTORY_INTERVAL_S, Metrics
from router.model_files import ModelNotFound, convert_once, provision
from router.children.memory_budget import AllBusy, LoadedModel, MemoryBudget, insufficient_memory
from router.children.model_names import ModelNames
from router.model_registry import ModelEntry
from router.children.model_waits import ModelWaits
from router.profiles import Profile
from router.children.supervisor import DEFAULT_WORKER_COMMAND, WorkerSupervisor
from router.children.worker_client import RequestStream, WorkerClient

logger = logging.getLogger(__name__)

EVICT_WAIT_S = 60.0  # how long a load waits for busy models to become evictable
_TTL_CHECK_S = 1.0
_RECENT = 20  # finished requests kept per model for recent tok/s


class WorkerPool:
    """model id -> supervised worker for the loaded models; every discovered model can
    be loaded on demand.

    Invariants: a model with requests in flight is never evicted; a pinned model is
    never evicted; loads are serialized (one `_load_lock`), so two loads never both
    count the same free memory.
    """

    def __init__(self, config: RouterConfig, models: Mapping[str, Path],
                 worker_command: Sequence[str] = DEFAULT_WORKER_COMMAND) -> None:
        self.config = config
        self.worker_command = tuple(worker_command)
        self.created = int(time.time())
        self.started_at = time.time()
        self.dequantize_all = config.worker.dtype != "auto"  # else quantized layers stay as stored
        self.registry: dict[str, ModelEntry] = model_registry.servable(
            config.models_dir, models, config.embedding_model, self.dequantize_all)
        self.names = ModelNames(self.registry, config, preload=list(models))
        self.supervisors: dict[str, WorkerSupervisor] = {}
        self.last_used: dict[str, float] = {}
        self.recent: dict[str, list[FinishEvent]] = {}
        self.states: dict[str, str] = {}  # transient states: loading / unloading
        self.runtime_dir: Path | None = None
        self._runtime_lock: FileLock | None = None  # held for life: marks runtime_dir as in use
        self.client: WorkerClient | None = None
        self.kvstore: KVStoreSupervisor | None = None
        self.memory = MemoryBudget.from_config(config)
        self._load_lock = asyncio.Lock()
        self._ttl_task: asyncio.Task[None] | None = None
        self._sample_task: asyncio.Task[None] | None = None
        self.metrics = Metrics()  # GET /metrics, and the dashboard's history
        self._tasks: set[asyncio.Task[Any]] = set()  # background loads after a reload
        self.waits = ModelWaits(self)  # requests waiting for their model, and the loads they start
        self._started = False
        self.accepting = asyncio.Event()  # set by start() once requests can wait for their models

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the kvstore, then the command-line and pinned models (READY or raise)."""
        if self._started:
            return
        self._started = True
        self.runtime_dir, self._runtime_lock = claim_runtime_dir()
        self.client = WorkerClient(ipc_address(self.runtime_dir, "workers"))
        await self.client.start()
        try:
            if self.config.cold_tier and self.config.worker.prefix_cache:
                self.kvstore = KVStoreSupervisor(self.config, self.runtime_dir, self.client)
                self.kvstore.on_restart = lambda: self.metrics.observe_restart("kvstore")
                await self.kvstore.start()
            self.names.check_config(self.config)
            self.accepting.set()
            for model_id in self.names.startup_models():
                await self.load(model_id)
        except BaseException:
            await self.stop()
            raise
        self._ttl_task = asyncio.create_task(self._unload_idle(), name="ttl")
        self._sample_task = asyncio.create_task(self._sample(), name="metrics-history")

    async def stop(self) -> None:
        """Shut every worker down (drain, SIGTERM, SIGKILL), then the kvstore."""
        if not self._started:
            return
        self._started = False
        for task in (self._ttl_task, self._sample_task):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(s.stop() for s in self.supervisors.values()), return_exceptions=True)
        if self.kvstore is not None:  # last: the workers' final writes must reach it
            await self.kvstore.stop()
        if self.client is not None:
            await self.client.close()
        if self.runtime_dir is not None:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)
        if self._runtime_lock is not None:
            self._runtime_lock.release()
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

    # ------------------------------------------------------------ names and memory

    @property
    def models(self) -> list[str]:
        return self.names.models

    @property
    def pinned(self) -> frozenset[str]:
        """The ids of the pinned models (admin pin/unpin change them at run time)."""
        return self.names.pinned_ids

    def resolve(self, name: str) -> tuple[str, Profile | None]:
        """A requested name -> (model id, profile or None), or a 404 (`ModelNames.resolve`)."""
        return self.names.resolve(name)

    def loaded(self) -> list[LoadedModel]:
        """What the memory budget knows of each running worker (a down one holds nothing)."""
        pinned = self.pinned
        return [LoadedModel(model_id, self.memory.need_bytes(self.registry[model_id]), supervisor.rss_bytes(),
                            self.last_used.get(model_id, 0.0), self.in_flight(model_id), model_id in pinned)
                for model_id, supervisor in self.supervisors.items() if supervisor.state != "down"]

    def used_bytes(self, exclude: str | None = None) -> int:
        return self.memory.used_bytes(m for m in self.loaded() if m.model_id != exclude)

    def apply_config(self, config: RouterConfig) -> list[str]:
        """Run with `config` from now on (a reload; `check_config` passed). Pins set at run
        time through /admin stay; a model newly pinned starts loading, and a lowered budget
        evicts idle models. Returns the models now loading."""
        self.config = config
        self.names.apply_config(config)
        self.memory = MemoryBudget.from_config(config)
        for supervisor in self.supervisors.values():
            supervisor.config = config
        if self.kvstore is not None:
            self.kvstore.config = config
        loading = [model_id for model_id in sorted(self.pinned)
                   if model_id not in self.supervisors and model_id in self.registry]
        for model_id in loading:
            self._background(self.load(model_id), f"loading pinned {model_id}")
        if self.used_bytes() > self.memory.budget_bytes:
            self._background(self._fit_budget(), "fitting the lowered memory budget")
        return loading

    async def _fit_budget(self) -> None:
        async with self._load_lock:
            await self._make_room("", 0)

    def _background(self, work: Any, what: str) -> None:
        """Run `work` without a waiter; a failure is logged, never lost."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)

        def done(task: asyncio.Task[Any]) -> None:
            self._tasks.discard(task)
            if not task.cancelled() and task.exception() is not None:
                logger.error("%s failed: %s", what, task.exception())

        task.add_done_callback(done)

    def get(self, model_id: str) -> WorkerSupervisor:
        """The loaded supervisor of `model_id`: 404 if unknown, 503 if not loaded."""
        model_id, _ = self.resolve(model_id)
        supervisor = self.supervisors.get(model_id)
        if supervisor is None:
            raise WorkerDead(f"model '{model_id}' is not loaded; POST /admin/models/{model_id}/load "
                             "or send it a request")
        return supervisor

    async def acquire(self, model_id: str, kinds: Sequence[str] = ("chat",), task: str = "completions") -> WorkerSupervisor:
        """The worker of a model id from `resolve` once ready (`router.children.model_waits`); a 400 unless it can serve `task`."""
        self.names.check_kind(model_id, kinds, task)
        self.last_used[model_id] = time.time()
        return await self.waits.until_ready(model_id)

    async def _on_disk(self, model_id: str, loading: str) -> ModelEntry:
        """`model_id`'s registry entry once its files are servable: a .gguf converted, a
        catalog model fetched (`loading`'s state says which, meanwhile)."""
        entry = self.registry[model_id]
        if entry.needs_conversion:
            self.states[loading] = "converting"
            path = await asyncio.to_thread(convert_once, entry.path, self.config.models_dir)
            entry = self.registry[model_id] = model_registry.entry_for(model_id, path, self.dequantize_all)
        elif entry.needs_provision:
            self.states[loading] = "provisioning"
            try:
                path = await asyncio.to_thread(provision, self.config.home, model_id, self.config.models_dir)
            except ModelNotFound as exc:
                raise RequestError(f"model '{model_id}' could not be fetched: {exc}", status=503,
                                   error_type="server_error", code="model_unavailable") from None
            finally:
                self.states.pop(loading, None)
            entry = self.registry[model_id] = model_registry.entry_for(model_id, path, self.dequantize_all)
        return entry

    async def load(self, model_id: str) -> WorkerSupervisor:
        """Load `model_id` (if it is not), evicting idle unpinned models LRU-first until its
        estimated need fits the budget. Returns once its worker is ready."""
        async with self._load_lock:
            supervisor = self.supervisors.get(model_id)
            if supervisor is not None and supervisor.state != "down":
                return supervisor
            if supervisor is not None:  # gave up earlier: replace it
                await supervisor.stop()
                del self.supervisors[model_id]
            entry = self.registry[model_id]
            draft_id = self.names.draft_of(model_id)
            need = self.memory.need_bytes(entry) + (self.registry[draft_id].weights_bytes if draft_id else 0)
            self.memory.check_fits_alone(model_id, need)
            await self._make_room(model_id, need)
            entry = await self._on_disk(model_id, model_id)
            supervisor = WorkerSupervisor(model_id, entry.path, self.config, self.client, self.worker_command,
                                          kind=entry.kind)
            if draft_id is not None:
                supervisor.draft_model_path = str((await self._on_disk(draft_id, model_id)).path)
            supervisor.on_restart = lambda: self.metrics.observe_restart("worker", model_id)
            supervisor.on_stats = lambda source, stats: self.metrics.observe_worker_stats(model_id, source, stats)
            if entry.kind == "chat":
                supervisor.kvstore_address = self.kvstore.address if self.kvstore is not None else ""
                supervisor.hot_tier_bytes = self.memory.hot_tier_bytes
            self.supervisors[model_id] = supervisor
            self.states[model_id] = "loading"
            logger.info("loading %s (needs ~%.2f GB; %.2f of %.2f GB in use)", model_id, need / 1e9,
                        self.used_bytes(exclude=model_id) / 1e9, self.memory.budget_bytes / 1e9)
            started = time.monotonic()
            try:
                await supervisor.start()
            except asyncio.CancelledError:
                raise  # stop() stops every supervisor still listed, this one included
            except BaseException:
                # stays listed as "down" with its last_error, for /health and the status
                self.metrics.observe_load(model_id, None)
                await supervisor.stop()
                raise
            finally:
                self.states.pop(model_id, None)
            self.metrics.observe_load(model_id, time.monotonic() - started)
            self.last_used[model_id] = time.time()  # its TTL counts from now, not from a request that waited
            return supervisor

    async def _make_room(self, model_id: str, need: int) -> None:
        """Unload the models `MemoryBudget.victim` names until `need` fits, waiting up to
        EVICT_WAIT_S for busy ones to finish."""
        deadline = time.monotonic() + EVICT_WAIT_S
        while True:
            try:
                victim = self.memory.victim(self.loaded(), model_id, need)
            except AllBusy:
                if time.monotonic() > deadline:
                    raise insufficient_memory(
                        f"model '{model_id}' cannot be loaded now: every evictable model has requests in "
                        f"flight after {EVICT_WAIT_S:.0f} s; retry shortly") from None
                await asyncio.sleep(0.2)
                continue
            if victim is None:
                return
            logger.info("evicting %s (least recently used) to make room for %s", victim, model_id)
            await self._unload(victim, "evicted")

    def in_flight(self, model_id: str) -> int:
        supervisor = self.supervisors.get(model_id)
        if supervisor is None or supervisor.identity is None or self.client is None:
            return 0
        return self.client.num_open_requests(supervisor.identity)

    async def _unload(self, model_id: str, reason: str) -> None:
        """Stop `model_id`'s worker; `reason` (admin, ttl, evicted) is what the metrics count."""
        supervisor = self.supervisors.get(model_id)
        if supervisor is None:
            return
        self.states[model_id] = "unloading"
        try:
            await supervisor.stop()
        finally:
            self.supervisors.pop(model_id, None)
            self.states.pop(model_id, None)
            self.metrics.observe_unload(model_id, reason)
        logger.info("unloaded %s", model_id)

    async def unload(self, model_id: str) -> None:
        """Unload on request (admin): drains its in-flight requests first."""
        model_id, _ = self.resolve(model_id)
        async with self._load_lock:
            await self._unload(model_id, "admin")

    def ttl_s(self, model_id: str) -> float:
        return float(self.config.ttl_for(model_id) or 0.0)

    async def _unload_idle(self) -> None:
        """Unload unpinned models idle longer than their TTL (or the global idle timeout)."""
        while True:
            await asyncio.sleep(_TTL_CHECK_S)
            now = time.time()
            for model_id in list(self.supervisors):
                ttl = self.ttl_s(model_id)
                supervisor = self.supervisors.get(model_id)
                if not ttl or model_id in self.pinned or self.in_flight(model_id) or (
                        supervisor is not None and supervisor.state != "ready"):
                    continue  # a model still loading (requests wait for it) is not idle
                if now - self.last_used.get(model_id, now) > ttl:
                    logger.info("%s idle for more than %.0f s; unloading", model_id, ttl)
                    async with self._load_lock:
                        if not self.in_flight(model_id):
                            await self._unload(model_id, "ttl")

    def record_finish(self, model_id: str, event: FinishEvent, duration_s: float | None = None) -> None:
        """Keep recent finished requests for the status route's tok/s, and count the
        generation's tokens and timings (`duration_s`: end to end, as the router saw it)."""
        recent = self.recent.setdefault(model_id, [])
        recent.append(event)
        del recent[:-_RECENT]
        self.last_used[model_id] = time.time()
        self.metrics.observe_finish(model_id, event, duration_s)

    async def kvstore_stats(self, timeout_s: float = 1.0) -> dict[str, Any] | None:
        """The kvstore's counters now (None: no cold tier, or it does not answer); every
        answer also feeds the metrics' cold-tier counters."""
        if self.kvstore is None:
            return None
        stats = await self.kvstore.stats(timeout_s)
        if stats is not None:
            self.metrics.observe_kvstore_stats(self.kvstore.child_key, stats)
        return stats

    def generation_streams(self) -> list[RequestStream]:
        """The open generation requests (not token counts or cache clears), oldest first."""
        streams = self.client.open_requests() if self.client is not None else []
        return sorted((s for s in streams if s.route), key=lambda s: s.created)

    async def _sample(self) -> None:
        """Every HISTORY_INTERVAL_S: a point of the dashboard's history, and the kvstore's
        counters (so the cold tier's counters move even when nobody scrapes)."""
        while True:
            try:
                streams = self.generation_streams()
                queued = sum(1 for s in streams if s.phase == "queued")
                self.metrics.sample(running=len(streams) - queued, queued=queued,
                                    streaming_tokens=sum(s.num_tokens for s in streams))
                await self.kvstore_stats()
            except Exception:  # the history must never take the service down
                logger.exception("metrics sampling failed")
            await asyncio.sleep(HISTORY_INTERVAL_S)

    # ------------------------------------------------------------ reporting

    def state_of(self, model_id: str) -> str:
        if model_id in self.states:
            return self.states[model_id]
        supervisor = self.supervisors.get(model_id)
        if supervisor is None:
            return "unloaded"
        if supervisor.state == "ready":
            return "ready" if self.in_flight(model_id) else "idle"
        return supervisor.state

    def is_healthy(self) -> bool:
        return all(s.state == "ready" for s in self.supervisors.values())

    def health(self) -> dict[str, Any]:
        health: dict[str, Any] = {
            "status": "ok" if self.is_healthy() else "degraded",
            "workers": {model_id: s.health() for model_id, s in self.supervisors.items()},
        }
        if self.kvstore is not None:
            health["kvstore"] = self.kvstore.health()
        return health
