"""Supervision of one model's worker process: spawn, handshake, watch, ping, restart, stop.

Health has two layers (docs/architecture.md): the process's exit is seen at once, and a worker
that stops answering pings for `ping_timeout_s` is killed as hung. Either way its
in-flight requests fail immediately and it is restarted with exponential backoff.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from protocol.errors import WorkerDead
from protocol.log_format import LOG_LEVEL_ENV
from protocol.messages import (
    PROTOCOL_VERSION,
    WORKER_ROLE,
    AddRequest,
    Hello,
    Message,
    Ping,
    Pong,
    Ready,
    Shutdown,
    StartupFailed,
    WorkerConfig,
)
from router.child_process import ChildProcess, describe_exit
from router.config import RouterConfig
from router.worker_client import RequestStream, WorkerClient

logger = logging.getLogger(__name__)

DEFAULT_WORKER_COMMAND = (sys.executable, "-m", "worker")

# how long a worker must stay up before its crash counts as new, not as a failed restart
STABLE_AFTER_S = 60.0


class WorkerStartupError(Exception):
    """A worker failed before READY: it exited, reported StartupFailed, or timed out."""


class _Stopping(Exception):
    """The supervisor was asked to stop while waiting."""


class WorkerSupervisor:
    """Keeps one worker for `model_id` running and says whether it can take requests.

    States: `loading` (first start), `ready`, `restarting` (dead or hung, a new one is on
    its way), `down` (gave up after `max_start_failures`, or stopped). Requests are only
    sent in `ready`; the switch out of `ready` and the failing of in-flight requests
    happen in one step with no await in between, so no request is left waiting on a
    worker that is gone.
    """

    def __init__(self, model_id: str, model_path: Path, config: RouterConfig, client: WorkerClient,
                 worker_command: Sequence[str] = DEFAULT_WORKER_COMMAND) -> None:
        self.model_id = model_id
        self.model_path = model_path
        self.config = config
        self.client = client
        self.worker_command = tuple(worker_command)
        self.state = "loading"
        self.num_restarts = 0
        self.last_error: str | None = None
        self.ready: Ready | None = None
        self.last_pong: Pong | None = None
        self.kvstore_address = ""  # set by the pool when the SSD tier runs
        self.hot_cache_bytes = config.hot_cache_bytes  # set by the pool from the memory budget
        self._restart_requested = False
        self.child: ChildProcess | None = None
        self.identity: bytes | None = None
        self._generation = 0
        self._control: asyncio.Queue[Message] = asyncio.Queue()
        self._stop = asyncio.Event()
        self._first_start: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    # ---------------------------------------------------------------- public

    async def start(self) -> None:
        """Spawn the worker and return once it is READY; raises `WorkerStartupError`."""
        self._first_start = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._run(), name=f"supervise-{self.model_id}")
        await self._first_start

    def open_request(self, add: AddRequest) -> RequestStream:
        """Send `add` to the worker; raises `WorkerDead` (a 503) unless it is ready."""
        if self.state != "ready" or self.identity is None:
            raise WorkerDead(self.unavailable_reason())
        return self.client.open_request(self.identity, add)

    @property
    def pid(self) -> int | None:
        """The running worker's pid, None while there is none."""
        return self.child.live_pid if self.child is not None else None

    def unavailable_reason(self) -> str:
        if self.state == "loading":
            return f"model '{self.model_id}' is still loading; retry shortly"
        if self.state == "restarting":
            return (f"the worker for model '{self.model_id}' is restarting "
                    f"(last error: {self.last_error}); retry shortly")
        return f"model '{self.model_id}' is unavailable: {self.last_error or 'its worker is stopped'}"

    def health(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "state": self.state,
            "pid": self.pid,
            "restarts": self.num_restarts,
            "last_error": self.last_error,
        }
        if self.ready is not None:
            info["context_length"] = self.ready.context_length
            info["device"] = self.ready.device
            info["blas"] = self.ready.blas
            info["attention"] = self.ready.attention
        if self.identity is not None:
            info["num_requests"] = self.client.num_open_requests(self.identity)
        if self.last_pong is not None and self.state == "ready":
            info["worker_active"] = self.last_pong.num_running
            info["worker_tokenizing"] = self.last_pong.num_tokenizing
        return info

    async def restart(self) -> None:
        """Replace the worker on purpose: it drains in-flight requests and flushes its SSD
        writes (Shutdown), exits, and a new one starts at once (no backoff, not counted as
        a failure). Returns when the new worker is ready; raises WorkerDead otherwise."""
        if self.state != "ready" or self.identity is None or self.child is None:
            raise WorkerDead(self.unavailable_reason())
        old_child = self.child
        self._restart_requested = True
        self.client.post(self.identity, Shutdown(drain_s=self.config.shutdown_drain_s))
        self.state = "restarting"  # new requests get a 503 + Retry-After; in-flight ones drain
        await asyncio.wait({old_child.exited}, timeout=self.config.shutdown_drain_s + self.config.kill_after_s + 15)
        if not old_child.exited.done():
            old_child.kill()
        deadline = time.monotonic() + self.config.load_timeout_s
        while not (self.state == "ready" and self.child is not old_child):
            if self.state == "down" or time.monotonic() > deadline:
                raise WorkerDead(self.unavailable_reason())
            await asyncio.sleep(0.1)

    async def stop(self) -> None:
        """Drain (Shutdown message), then SIGTERM, then SIGKILL; fails what is left."""
        self._stop.set()
        was_ready, self.state = self.state == "ready", "down"
        child, identity = self.child, self.identity
        if was_ready and child is not None and child.alive() and identity is not None:
            self.client.post(identity, Shutdown(drain_s=self.config.shutdown_drain_s))
            try:
                await asyncio.wait_for(asyncio.shield(child.exited), self.config.shutdown_drain_s + 1.0)
            except TimeoutError:
                pass
        if child is not None:
            returncode = await child.stop(self.config.kill_after_s)
            logger.info("worker for %s stopped (%s)", self.model_id, describe_exit(returncode))
        if identity is not None:
            self.client.fail_requests(identity, WorkerDead("the server is shutting down"))
            self.client.remove_peer(identity)
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        self.state = "down"

    # ---------------------------------------------------------------- the loop

    async def _run(self) -> None:
        backoff = self.config.restart_backoff_s
        num_failures = 0
        try:
            while not self._stop.is_set():
                try:
                    reason, lived_s = await self._run_once()
                except _Stopping:
                    return
                except WorkerStartupError as exc:
                    reason, lived_s = str(exc), 0.0
                    self.last_error = reason
                    if self._first_start is not None and not self._first_start.done():
                        self.state = "down"
                        self._first_start.set_exception(exc)
                        return
                    logger.error("%s", reason)
                except Exception as exc:  # a bug here must not leave the model silently dead
                    logger.exception("supervisor for %s failed", self.model_id)
                    reason, lived_s = f"supervisor error: {exc!r}", 0.0
                    if self.child is not None and self.identity is not None:
                        self._retire(reason)
                if self._stop.is_set():
                    return
                if self._restart_requested:  # asked for: start the next one right away
                    self._restart_requested = False
                    self.num_restarts += 1
                    self.state = "restarting"
                    continue
                if lived_s >= STABLE_AFTER_S:  # a fresh crash, not a crash loop
                    backoff, num_failures = self.config.restart_backoff_s, 0
                num_failures += 1
                if num_failures > self.config.max_start_failures:
                    self.state = "down"
                    logger.error("worker for %s failed %d times in a row; leaving it down "
                                 "(see /health last_error)", self.model_id, num_failures)
                    return
                self.state = "restarting"
                logger.warning("restarting worker for %s in %.1f s", self.model_id, backoff)
                try:
                    await asyncio.wait_for(self._stop.wait(), backoff)
                    return
                except TimeoutError:
                    pass
                backoff = min(backoff * 2, self.config.restart_backoff_max_s)
                self.num_restarts += 1
        finally:
            if self._first_start is not None and not self._first_start.done():
                self._first_start.set_exception(WorkerStartupError(
                    f"worker for '{self.model_id}' was stopped before it was ready"))
                self._first_start.exception()  # retrieved: nobody may be waiting any more

    async def _run_once(self) -> tuple[str, float]:
        """One worker's life: spawn, handshake, serve; returns why it ended and how long
        it was ready. Raises `WorkerStartupError`, or `_Stopping` (stop() cleans up)."""
        self._spawn()
        assert self.child is not None and self.identity is not None
        try:
            self.ready = await self._handshake()
        except WorkerStartupError:
            self._retire(None)
            raise
        ready_at = time.monotonic()
        self.state = "ready"
        logger.info("worker for %s ready (pid %d, %s, context %d, %.1f s to load)",
                    self.model_id, self.child.pid, self.ready.device, self.ready.context_length,
                    self.ready.load_time_s)
        if self._first_start is not None and not self._first_start.done():
            self._first_start.set_result(None)
        reason = await self._watch()
        if reason is None:
            raise _Stopping
        self._retire(reason)
        logger.error("worker for %s %s", self.model_id, reason)
        return reason, time.monotonic() - ready_at

    def _spawn(self) -> None:
        self._generation += 1
        identity = f"{self.model_id}#{self._generation}"
        self.identity = identity.encode()
        self._control = asyncio.Queue()
        self.client.add_peer(self.identity, self._on_message)
        argv = [*self.worker_command, "--connect", self.client.address, "--identity", identity]
        self.child = ChildProcess(argv, label=f"worker[{identity}]", env={LOG_LEVEL_ENV: self.config.log_level})
        logger.info("spawned worker %s (pid %d) for %s", identity, self.child.pid, self.model_path)

    def _retire(self, reason: str | None) -> None:
        """Take the current worker out of service: no await here (see class docstring)."""
        assert self.identity is not None and self.child is not None
        self.state = "restarting"
        if reason is not None:
            self.last_error = reason
            num_failed = self.client.fail_requests(self.identity, WorkerDead(
                f"the worker for model '{self.model_id}' {reason}; the request could not finish. "
                "It is being restarted; retry shortly."))
            if num_failed:
                logger.warning("failed %d in-flight request(s) of %s", num_failed, self.model_id)
        self.client.remove_peer(self.identity)
        self.child.kill()

    def _on_message(self, message: Message) -> None:
        if isinstance(message, (Hello, Ready, StartupFailed)):
            self._control.put_nowait(message)
        elif isinstance(message, Pong):
            # any message is a sign of life (WorkerClient.last_heard); a pong also says
            # how busy the worker is, as the worker itself counts it
            self.last_pong = message

    async def _next_control(self, deadline: float) -> Message:
        assert self.child is not None
        getter = asyncio.ensure_future(self._control.get())
        stopper = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({getter, stopper, self.child.exited}, timeout=max(0.0, deadline - time.monotonic()),
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (getter, stopper):
                if not waiter.done():
                    waiter.cancel()
        if getter.done() and not getter.cancelled():
            return getter.result()
        if self._stop.is_set():
            raise _Stopping
        if self.child.exited.done():
            tail = await self.child.output_tail()
            raise WorkerStartupError(
                f"worker for '{self.model_id}' exited before it was ready "
                f"({describe_exit(self.child.exited.result())}); its last output:\n{tail or '(none)'}")
        raise WorkerStartupError(
            f"worker for '{self.model_id}' was not ready within {self.config.load_timeout_s:.0f} s "
            "(raise --load-timeout-s if the model is just slow to load)")

    async def _handshake(self) -> Ready:
        assert self.identity is not None
        deadline = time.monotonic() + self.config.load_timeout_s
        hello = await self._next_control(deadline)
        if not isinstance(hello, Hello):
            raise WorkerStartupError(f"worker sent {hello.type} before hello")
        if hello.protocol_version != PROTOCOL_VERSION:
            raise WorkerStartupError(
                f"worker speaks protocol version {hello.protocol_version}, the router "
                f"{PROTOCOL_VERSION}: the installation is inconsistent, reinstall mlxd")
        if hello.role != WORKER_ROLE:
            raise WorkerStartupError(f"a {hello.role!r} process answered on the worker socket, not a worker")
        self.client.post(self.identity, self._worker_config())
        while True:
            message = await self._next_control(deadline)
            if isinstance(message, Ready):
                return message
            if isinstance(message, StartupFailed):
                raise WorkerStartupError(f"worker for '{self.model_id}' failed to start: {message.message}")
            logger.warning("unexpected %s from a loading worker; ignored", message.type)

    def _worker_config(self) -> WorkerConfig:
        c = self.config
        return WorkerConfig(
            protocol_version=PROTOCOL_VERSION, model_id=self.model_id, model_path=str(self.model_path),
            max_num_seqs=c.max_num_seqs, max_queue=c.max_queue, prefill_chunk_tokens=c.prefill_chunk_tokens,
            batch_window_ms=c.batch_window_ms,
            block_tokens=c.block_tokens, hot_cache_bytes=self.hot_cache_bytes, prefix_cache=c.prefix_cache,
            kvstore_address=self.kvstore_address, max_context_tokens=c.max_context_tokens,
            default_max_tokens=c.default_max_tokens, dtype=c.dtype, heartbeat_s=c.heartbeat_s,
        )

    async def _watch(self) -> str | None:
        """Until the worker dies or hangs (returns why) or we are stopping (None)."""
        assert self.child is not None and self.identity is not None
        nonce = 0
        stopper = asyncio.ensure_future(self._stop.wait())
        try:
            while True:
                await asyncio.wait({stopper, self.child.exited}, timeout=self.config.heartbeat_s,
                                   return_when=asyncio.FIRST_COMPLETED)
                if self._stop.is_set():
                    return None
                if self.child.exited.done():  # its last output is already in the log
                    if self._restart_requested:
                        return "restarted on request"
                    return f"exited unexpectedly ({describe_exit(self.child.exited.result())})"
                silent_s = time.monotonic() - self.client.last_heard(self.identity)
                if silent_s > self.config.ping_timeout_s:
                    return (f"did not answer pings for {silent_s:.0f} s and was killed as hung "
                            f"(ping timeout {self.config.ping_timeout_s:.0f} s, --ping-timeout-s)")
                nonce += 1
                self.client.post(self.identity, Ping(nonce=nonce, sent_at=time.time()))
        finally:
            stopper.cancel()
