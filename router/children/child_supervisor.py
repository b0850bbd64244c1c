"""The lifecycle every supervised child shares: spawn, handshake, watch, ping, restart, stop.

A child connects to the router's one ROUTER socket (`WorkerClient`) as `name#generation`,
sends Hello, gets its config message, and sends its ready message. Health has two layers
(docs/architecture.md): its exit is seen at once, and a child silent for its ping timeout
is killed as hung. Either way it is restarted with exponential backoff.
"""

from __future__ import annotations

import asyncio
import logging
import itertools
import time
from collections.abc import Callable
from typing import Any, ClassVar

import psutil

from protocol.errors import WorkerDead
from protocol.messages import (
    PROTOCOL_VERSION,
    Hello,
    Message,
    Ping,
    Shutdown,
    StartupFailed,
)
from router.children.child_process import ChildProcess, describe_exit
from router.config import RouterConfig
from router.log_files import child_log_env
from router.children.worker_client import WorkerClient

logger = logging.getLogger(__name__)

# how long a child must stay up before its crash counts as new, not as a failed restart
STABLE_AFTER_S = 60.0

_INSTANCES = itertools.count(1)  # one number per supervisor: with the generation, names one child for good


class ChildStartupError(Exception):
    """A child failed before its ready message: it exited, reported StartupFailed, timed out,
    or answered the handshake as something else."""


class _Stopping(Exception):
    """The supervisor was asked to stop while waiting."""


class ChildSupervisor:
    """Keeps one child process running; subclasses say what it is.

    States: `starting_state` (first start), `ready`, `restarting` (dead or hung, a new one
    is on its way), `down` (gave up after `max_start_failures`, or stopped). The switch out
    of `ready` and `_retire` happen in one step with no await in between, so nothing is
    left waiting on a child that is gone.

    A subclass sets `role` (the Hello.role it expects), `ready_type`, `startup_error`, and
    implements `_argv`, `_config_message`, `_ping_timeout` and, if it needs them,
    `_on_ready`, `_on_other_message` and `_fail_in_flight`.
    """

    role: ClassVar[str] = ""
    ready_type: ClassVar[type[Message]] = Message
    startup_error: ClassVar[type[ChildStartupError]] = ChildStartupError
    starting_state: ClassVar[str] = "starting"

    def __init__(self, name: str, label: str, config: RouterConfig, client: WorkerClient) -> None:
        self.name = name  # the identity prefix: name#generation
        self.label = label  # how logs and errors name it ("worker for 'm'", "kvstore")
        self.config = config
        self.client = client
        self.state = self.starting_state
        self.num_restarts = 0
        self.on_restart: Callable[[], None] | None = None  # the pool's metrics count restarts
        self.instance = next(_INSTANCES)
        self.last_error: str | None = None
        self.child: ChildProcess | None = None
        self.identity: bytes | None = None
        self._restart_requested = False
        self._generation = 0
        self._control: asyncio.Queue[Message] = asyncio.Queue()
        self._stop = asyncio.Event()
        self._first_start: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    # ---------------------------------------------------------------- what a subclass says

    def _argv(self, identity: str) -> list[str]:
        """The command that starts the child, connecting as `identity`."""
        raise NotImplementedError

    def _config_message(self) -> Message:
        """The answer to the child's Hello."""
        raise NotImplementedError

    def _ping_timeout(self) -> tuple[float, str]:
        """Seconds of silence after which the child is hung, and the flag that sets it."""
        raise NotImplementedError

    @property
    def startup_timeout_s(self) -> float:
        return self.config.load_timeout_s

    @property
    def startup_timeout_hint(self) -> str:
        return "raise --load-timeout-s if it is just slow to start"

    @property
    def kill_after_s(self) -> float:
        return self.config.kill_after_s

    def _on_ready(self, ready: Message) -> None:
        """Called once per generation when its ready message arrived."""

    def _on_other_message(self, message: Message) -> None:
        """A message from the live child that is not part of the handshake (a Pong …)."""

    def _fail_in_flight(self, reason: str, *, shutting_down: bool = False) -> None:
        """The child is gone for `reason`: fail what it was doing (no await here)."""

    # ---------------------------------------------------------------- public

    async def start(self) -> None:
        """Spawn the child and return once it is ready; raises `startup_error`."""
        self._first_start = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._run(), name=f"supervise-{self.name}")
        await self._first_start

    @property
    def pid(self) -> int | None:
        """The running child's pid, None while there is none."""
        return self.child.live_pid if self.child is not None else None

    def rss_bytes(self) -> int:
        """The running child's resident memory (0 while there is none): what the memory
        budget charges a model that grew past its estimate."""
        pid = self.pid
        if pid is None:
            return 0
        try:
            return psutil.Process(pid).memory_info().rss
        except psutil.Error:
            return 0

    def seconds_since_heard(self) -> float | None:
        """Seconds since the ready child last sent anything (None: none is ready)."""
        if self.state != "ready" or self.identity is None:
            return None
        return time.monotonic() - self.client.last_heard(self.identity)

    def health(self) -> dict[str, Any]:
        return {"state": self.state, "pid": self.pid, "restarts": self.num_restarts, "last_error": self.last_error}

    def unavailable_reason(self) -> str:
        return f"the {self.label} is {self.state} (last error: {self.last_error or 'none'})"

    async def restart(self) -> None:
        """Replace the child on purpose: it drains and flushes (Shutdown), exits, and a new
        one starts at once (no backoff, not counted as a failure). Returns when the new one
        is ready; raises `WorkerDead` (a dead process, in the router's terms) otherwise."""
        if self.state != "ready" or self.identity is None or self.child is None:
            raise WorkerDead(self.unavailable_reason())
        old_child = self.child
        self._restart_requested = True
        self.client.post(self.identity, Shutdown(drain_s=self.config.shutdown_drain_s))
        self.state = "restarting"
        await asyncio.wait({old_child.exited}, timeout=self.config.shutdown_drain_s + self.kill_after_s + 15)
        if not old_child.exited.done():
            old_child.kill()
        deadline = time.monotonic() + self.startup_timeout_s
        while not (self.state == "ready" and self.child is not old_child):
            if self.state == "down" or time.monotonic() > deadline:
                raise WorkerDead(self.unavailable_reason())
            await asyncio.sleep(0.1)

    async def stop(self) -> None:
        """Shutdown message (drain, flush), then SIGTERM, then SIGKILL."""
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
            returncode = await child.stop(self.kill_after_s)
            logger.info("%s stopped (%s)", self.label, describe_exit(returncode))
        if identity is not None:
            self._fail_in_flight("the server is shutting down", shutting_down=True)
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
                except ChildStartupError as exc:
                    reason, lived_s = str(exc), 0.0
                    self.last_error = reason
                    if self._first_start is not None and not self._first_start.done():
                        self.state = "down"
                        self._first_start.set_exception(exc)
                        return
                    logger.error("%s", reason)
                except Exception as exc:  # a bug here must not leave the child silently dead
                    logger.exception("supervisor of %s failed", self.label)
                    reason, lived_s = f"supervisor error: {exc!r}", 0.0
                    if self.child is not None and self.identity is not None:
                        self._retire(reason)
                if self._stop.is_set():
                    return
                if self._restart_requested:  # asked for: start the next one right away
                    self._restart_requested = False
                    self._count_restart()
                    self.state = "restarting"
                    continue
                if lived_s >= STABLE_AFTER_S:  # a fresh crash, not a crash loop
                    backoff, num_failures = self.config.restart_backoff_s, 0
                num_failures += 1
                if num_failures > self.config.max_start_failures:
                    self.state = "down"
                    logger.error("%s failed %d times in a row; leaving it down (see /health last_error)",
                                 self.label, num_failures)
                    return
                self.state = "restarting"
                logger.warning("restarting %s in %.1f s", self.label, backoff)
                try:
                    await asyncio.wait_for(self._stop.wait(), backoff)
                    return
                except TimeoutError:
                    pass
                backoff = min(backoff * 2, self.config.restart_backoff_max_s)
                self._count_restart()
        finally:
            if self._first_start is not None and not self._first_start.done():
                self._first_start.set_exception(self.startup_error(f"{self.label} was stopped before it was ready"))
                self._first_start.exception()  # retrieved: nobody may be waiting any more

    def _count_restart(self) -> None:
        self.num_restarts += 1
        if self.on_restart is not None:
            self.on_restart()

    @property
    def child_key(self) -> str:
        """Names the running child among every child this router ever ran (for counters that
        a child reports as totals since it started)."""
        return f"{self.instance}:{self.identity.decode() if self.identity else ''}"

    async def _run_once(self) -> tuple[str, float]:
        """One child's life: spawn, handshake, serve; returns why it ended and how long it
        was ready. Raises `startup_error`, or `_Stopping` (stop() cleans up)."""
        self._spawn()
        assert self.child is not None and self.identity is not None
        try:
            ready = await self._handshake()
        except ChildStartupError:
            self._retire(None)
            raise
        ready_at = time.monotonic()
        self.state = "ready"
        self._on_ready(ready)
        if self._first_start is not None and not self._first_start.done():
            self._first_start.set_result(None)
        reason = await self._watch()
        if reason is None:
            raise _Stopping
        self._retire(reason)
        logger.error("%s %s", self.label, reason)
        return reason, time.monotonic() - ready_at

    def _spawn(self) -> None:
        self._generation += 1
        identity = f"{self.name}#{self._generation}"
        self.identity = identity.encode()
        self._control = asyncio.Queue()
        self.client.add_peer(self.identity, self._on_message)
        self.child = ChildProcess(self._argv(identity), label=f"{self.role}[{identity}]",
                                  env=child_log_env(self.config, self.role, self.name))
        logger.info("spawned %s %s (pid %d)", self.role, identity, self.child.pid)

    def _retire(self, reason: str | None) -> None:
        """Take the current child out of service: no await here (see class docstring)."""
        assert self.identity is not None and self.child is not None
        self.state = "restarting"
        if reason is not None:
            self.last_error = reason
            self._fail_in_flight(reason)
        self.client.remove_peer(self.identity)
        self.child.kill()

    def _on_message(self, message: Message) -> None:
        if isinstance(message, (Hello, StartupFailed, self.ready_type)):
            self._control.put_nowait(message)
        else:  # any message is also a sign of life (WorkerClient.last_heard)
            self._on_other_message(message)

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
            raise self.startup_error(
                f"{self.label} exited before it was ready ({describe_exit(self.child.exited.result())}); "
                f"its last output:\n{tail or '(none)'}")
        raise self.startup_error(f"{self.label} was not ready within {self.startup_timeout_s:.0f} s "
                                 f"({self.startup_timeout_hint})")

    async def _handshake(self) -> Message:
        assert self.identity is not None
        deadline = time.monotonic() + self.startup_timeout_s
        hello = await self._next_control(deadline)
        if not isinstance(hello, Hello):
            raise self.startup_error(f"{self.label} sent {hello.type} before hello")
        if hello.protocol_version != PROTOCOL_VERSION:
            raise self.startup_error(
                f"{self.label} speaks protocol version {hello.protocol_version}, the router "
                f"{PROTOCOL_VERSION}: the installation is inconsistent, reinstall mlxd")
        if hello.role != self.role:
            raise self.startup_error(f"a {hello.role!r} process answered as {self.label}, not a {self.role}")
        self.client.post(self.identity, self._config_message())
        while True:
            message = await self._next_control(deadline)
            if isinstance(message, self.ready_type):
                return message
            if isinstance(message, StartupFailed):
                raise self.startup_error(f"{self.label} failed to start: {message.message}")
            logger.warning("unexpected %s from a starting %s; ignored", message.type, self.role)

    async def _watch(self) -> str | None:
        """Until the child dies or hangs (returns why) or we are stopping (None)."""
        assert self.child is not None and self.identity is not None
        timeout_s, flag = self._ping_timeout()
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
                if silent_s > timeout_s:
                    return (f"did not answer pings for {silent_s:.1f} s and was killed as hung "
                            f"(pid {self.child.pid}, ping timeout {timeout_s:g} s, {flag})")
                nonce += 1
                self.client.post(self.identity, Ping(nonce=nonce, sent_at=time.time()))
        finally:
            stopper.cancel()
