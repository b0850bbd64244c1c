"""The child side of a supervised process's life, written once for the worker, the encoder
worker and the kvstore: Hello, the parent's config, pings answered, and a stop (Shutdown,
SIGTERM or the parent's death) obeyed at any time, the handshake included.

The parent side is `router.children.child_supervisor`; a child says Hello, waits for its config
message, loads, sends its own ready message, then answers Ping with Pong until told to stop.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

import zmq

from protocol.codec import decode, encode
from protocol.errors import ProtocolError
from protocol.messages import PROTOCOL_VERSION, Hello, Message, Ping, Pong, Shutdown, StartupFailed
from protocol.settings import SettingError
from protocol.sockets import make_socket

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 60.0  # for the parent's answer to Hello
_HANDSHAKE_POLL_MS = 200  # how often the handshake looks at the stop flag and the parent pid


class _Checkable(Protocol):
    def check(self) -> None: ...


class ChildConfig(Protocol):
    """What every config message a parent answers Hello with carries (`WorkerConfig`,
    `KVStoreConfig`)."""

    protocol_version: int
    settings: _Checkable


ConfigT = TypeVar("ConfigT", bound=ChildConfig)


def plain_pong(ping: Ping) -> Pong:
    """The answer of a child with no load to report (the kvstore, or anyone mid-handshake)."""
    return Pong(ping.nonce, ping.sent_at)


class Lifecycle:
    """Whether this process should stop, and by when. Signal handlers only set
    `stop_requested`; the loops read it and act.

    `drain_deadline` (monotonic seconds) is set by a Shutdown, or by the loop once it sees a
    signal; `orphaned` once the parent is gone, when nobody waits on the work any more.
    """

    def __init__(self, parent_pid: int | None = None) -> None:
        self.parent_pid = parent_pid or os.getppid()
        self.stop_requested = False
        self.drain_deadline: float | None = None
        self.orphaned = False

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT ask for a stop (main thread only, as Python requires)."""

        def on_signal(signum: int, _frame: object) -> None:
            self.stop_requested = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    def parent_gone(self) -> bool:
        """The parent died (we were re-parented): a child exits when its parent does."""
        if os.getppid() != self.parent_pid:
            self.orphaned = True
        return self.orphaned

    def obey(self, message: Message, send: Callable[[Message], None],
             pong: Callable[[Ping], Pong] = plain_pong) -> bool:
        """Act on a lifecycle message: a Ping is answered with `pong(ping)`, a Shutdown asks
        for a stop drained within its `drain_s`. False for any other message."""
        if isinstance(message, Ping):
            send(pong(message))
        elif isinstance(message, Shutdown):
            self.stop_requested = True
            self.drain_deadline = time.monotonic() + message.drain_s
        else:
            return False
        return True


class ParentChannel:
    """A child's DEALER socket to its parent's ROUTER socket.

    Sends never block: if the parent is gone the message is dropped (and logged), and the
    parent-death check ends the process soon after. `linger_ms` is how long close() lets
    a last message (a StartupFailed) reach the parent.
    """

    def __init__(self, address: str, identity: str, lifecycle: Lifecycle, *,
                 context: zmq.Context | None = None, linger_ms: int = 1000) -> None:
        self.lifecycle = lifecycle
        self._own_context = context is None
        self.context = context if context is not None else zmq.Context()
        self.socket = make_socket(self.context, zmq.DEALER, address, bind=False, identity=identity.encode())
        self._linger_ms = linger_ms

    def send(self, message: Message) -> None:
        try:
            self.socket.send_multipart(encode(message), flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            log.warning("parent not reachable; dropped %s", message.type)

    def receive(self, timeout_ms: int) -> Message | None:
        """The next message within `timeout_ms`, or None (nothing came, or it was not a
        message: logged and dropped, the parent's next one is read normally)."""
        if not self.socket.poll(timeout_ms):
            return None
        try:
            message, _ = decode(self.socket.recv_multipart(copy=True))
        except ProtocolError as exc:
            log.error("ignoring a bad message from the parent: %s", exc)
            return None
        return message

    def handshake(self, role: str, config_type: type[ConfigT],
                  timeout_s: float = HANDSHAKE_TIMEOUT_S) -> ConfigT | None:
        """Hello, then the parent's `config_type` message, checked. None when the process
        should end instead of starting: a stop was asked for (Shutdown or signal, see
        `lifecycle.stop_requested`), the parent died, no config came in time, or the config
        is unusable (then StartupFailed says why). Pings are answered meanwhile."""
        self.send(Hello(protocol_version=PROTOCOL_VERSION, role=role, pid=os.getpid()))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.lifecycle.stop_requested:
                log.info("asked to stop before the configuration came; exiting")
                return None
            if self.lifecycle.parent_gone():
                log.warning("parent went away during the handshake; exiting")
                return None
            message = self.receive(_HANDSHAKE_POLL_MS)
            if isinstance(message, config_type):
                return message if self._usable(message, role) else None
            if message is not None and not self.lifecycle.obey(message, self.send):
                log.warning("ignoring %s before the configuration", message.type)
        log.error("no configuration from the parent within %.0f s", timeout_s)
        return None

    def _usable(self, config: ChildConfig, role: str) -> bool:
        if config.protocol_version != PROTOCOL_VERSION:
            problem = (f"the router speaks protocol version {config.protocol_version}, the {role} "
                       f"{PROTOCOL_VERSION}: the installation is inconsistent, reinstall mlxd")
        else:
            try:
                config.settings.check()
                return True
            except SettingError as exc:
                problem = f"bad setting {exc}"
        self.startup_failed(problem)
        return False

    def startup_failed(self, problem: str) -> None:
        """Log `problem` and tell the parent, whose start() raises it."""
        log.error("%s", problem)
        self.send(StartupFailed(problem))

    def close(self) -> None:
        self.socket.close(linger=self._linger_ms)
        if self._own_context:
            self.context.term()


def exit_code_without_config(lifecycle: Lifecycle) -> int:
    """A child that got no usable config: 0 if it was told to stop (it did what was asked),
    2 otherwise (it could not start)."""
    return 0 if lifecycle.stop_requested else 2
