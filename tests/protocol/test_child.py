"""protocol.child, the child side of the lifecycle, over real ZeroMQ sockets: Hello, the
config, pings answered, and a stop (Shutdown, signal, parent death) obeyed during the
handshake, for both flavours of child (a worker's `WorkerConfig`, the kvstore's
`KVStoreConfig`). The last tests run the real `python -m worker` and `python -m kvstore`
against a parent played by the test, so both processes are held to the same behaviour."""

from __future__ import annotations

import dataclasses
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import zmq

from protocol.child import HANDSHAKE_TIMEOUT_S, Lifecycle, ParentChannel, exit_code_without_config
from protocol.codec import decode, encode
from protocol.messages import (
    KVSTORE_ROLE,
    PROTOCOL_VERSION,
    WORKER_ROLE,
    Hello,
    KVStoreConfig,
    Message,
    Ping,
    Pong,
    Shutdown,
    StartupFailed,
    WorkerConfig,
)
from protocol.settings import KVStoreSettings, WorkerSettings
from protocol.sockets import make_socket

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)


@dataclass(frozen=True)
class Flavour:
    role: str
    config: Message  # a usable config of this flavour

    @property
    def config_type(self) -> type[Message]:
        return type(self.config)


WORKER = Flavour(WORKER_ROLE, WorkerConfig(protocol_version=PROTOCOL_VERSION, model_id="m", model_path="/nowhere"))
KVSTORE = Flavour(KVSTORE_ROLE, KVStoreConfig(protocol_version=PROTOCOL_VERSION, root="/nowhere", bind="ipc://x"))
FLAVOURS = pytest.mark.parametrize("flavour", [WORKER, KVSTORE], ids=["worker", "kvstore"])

_ADDRESSES = itertools.count()


class Parent:
    """The router's side, played by the test: a ROUTER socket the child connects to."""

    def __init__(self, context: zmq.Context, address: str) -> None:
        self.socket = make_socket(context, zmq.ROUTER, address, bind=True)

    def receive(self, timeout_s: float = 10.0) -> tuple[bytes, Message]:
        assert self.socket.poll(int(timeout_s * 1000)), "the child sent nothing"
        identity, *parts = self.socket.recv_multipart()
        message, _ = decode(parts)
        return identity, message

    def send(self, identity: bytes, message: Message) -> None:
        self.socket.send_multipart([identity, *encode(message)])

    def silent_for(self, seconds: float) -> bool:
        return not self.socket.poll(int(seconds * 1000))


@dataclass
class Child:
    """A child's handshake running on a thread, as its main loop would run it."""

    channel: ParentChannel
    flavour: Flavour
    timeout_s: float = HANDSHAKE_TIMEOUT_S
    result: list[Any] = field(default_factory=list)
    took_s: float = 0.0

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        started = time.monotonic()
        self.result.append(self.channel.handshake(self.flavour.role, self.flavour.config_type, self.timeout_s))
        self.took_s = time.monotonic() - started

    def outcome(self, within_s: float = 5.0) -> Any:
        self.thread.join(within_s)
        assert not self.thread.is_alive(), f"the handshake still runs after {within_s} s"
        return self.result[0]


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.term()


@pytest.fixture
def sockets(context: zmq.Context) -> Iterator[tuple[Parent, ParentChannel]]:
    address = f"inproc://child-{next(_ADDRESSES)}"
    parent = Parent(context, address)
    channel = ParentChannel(address, "c#1", Lifecycle(), context=context, linger_ms=0)
    yield parent, channel
    channel.close()
    parent.socket.close(linger=0)


@FLAVOURS
def test_the_handshake_is_hello_then_the_config(sockets: tuple[Parent, ParentChannel], flavour: Flavour) -> None:
    parent, channel = sockets
    child = Child(channel, flavour)
    identity, hello = parent.receive()
    assert identity == b"c#1"
    assert hello == Hello(protocol_version=PROTOCOL_VERSION, role=flavour.role, pid=os.getpid())
    parent.send(identity, flavour.config)
    assert child.outcome() == flavour.config
    assert not channel.lifecycle.stop_requested


@FLAVOURS
def test_a_ping_is_answered_during_the_handshake_and_after(sockets: tuple[Parent, ParentChannel],
                                                           flavour: Flavour) -> None:
    parent, channel = sockets
    child = Child(channel, flavour)
    identity, _ = parent.receive()
    parent.send(identity, Ping(nonce=7, sent_at=12.5))
    assert parent.receive()[1] == Pong(7, 12.5)
    parent.send(identity, flavour.config)
    assert child.outcome() == flavour.config
    # after the handshake, the loop hands each message to obey(), with its own load report
    parent.send(identity, Ping(nonce=8, sent_at=13.0))
    message = channel.receive(5000)
    assert message is not None
    assert channel.lifecycle.obey(message, channel.send, lambda ping: Pong(ping.nonce, ping.sent_at, 3, 1))
    assert parent.receive()[1] == Pong(8, 13.0, 3, 1)


@FLAVOURS
def test_a_shutdown_during_the_handshake_ends_the_child_cleanly(sockets: tuple[Parent, ParentChannel],
                                                               flavour: Flavour) -> None:
    parent, channel = sockets
    child = Child(channel, flavour)
    identity, _ = parent.receive()
    parent.send(identity, Shutdown(drain_s=2.0))
    assert child.outcome() is None
    assert child.took_s < 5.0  # at once, not at the end of the handshake timeout
    assert channel.lifecycle.stop_requested
    assert exit_code_without_config(channel.lifecycle) == 0  # it did what it was asked
    parent.send(identity, flavour.config)  # too late: nobody reads it
    assert parent.silent_for(0.5), "the child said something after it was told to stop"


@FLAVOURS
def test_a_signal_during_the_handshake_ends_it(sockets: tuple[Parent, ParentChannel], flavour: Flavour) -> None:
    parent, channel = sockets
    child = Child(channel, flavour)
    parent.receive()
    channel.lifecycle.stop_requested = True  # what the SIGTERM handler does
    assert child.outcome() is None
    assert exit_code_without_config(channel.lifecycle) == 0


@FLAVOURS
def test_the_handshake_ends_when_the_parent_is_gone(context: zmq.Context, flavour: Flavour) -> None:
    address = f"inproc://child-{next(_ADDRESSES)}"
    parent = Parent(context, address)
    not_our_parent = os.getpid()  # our parent is pytest's parent, never ourselves
    channel = ParentChannel(address, "c#1", Lifecycle(parent_pid=not_our_parent), context=context, linger_ms=0)
    try:
        child = Child(channel, flavour)
        assert child.outcome() is None
        assert channel.lifecycle.orphaned
    finally:
        channel.close()
        parent.socket.close(linger=0)


@FLAVOURS
def test_a_config_of_another_protocol_version_is_refused_with_the_reason(sockets: tuple[Parent, ParentChannel],
                                                                         flavour: Flavour) -> None:
    parent, channel = sockets
    child = Child(channel, flavour)
    identity, _ = parent.receive()
    parent.send(identity, dataclasses.replace(flavour.config, protocol_version=PROTOCOL_VERSION + 1))
    assert child.outcome() is None
    failed = parent.receive()[1]
    assert isinstance(failed, StartupFailed)
    assert f"protocol version {PROTOCOL_VERSION + 1}" in failed.message and "reinstall mlxd" in failed.message
    assert exit_code_without_config(channel.lifecycle) == 2


@pytest.mark.parametrize(("flavour", "settings", "key"), [
    (WORKER, WorkerSettings(max_num_seqs=0), "max_num_seqs"),
    (KVSTORE, KVStoreSettings(segment_bytes=10), "segment_bytes"),
], ids=["worker", "kvstore"])
def test_a_setting_out_of_range_is_refused_naming_it(sockets: tuple[Parent, ParentChannel], flavour: Flavour,
                                                     settings: object, key: str) -> None:
    parent, channel = sockets
    child = Child(channel, flavour)
    identity, _ = parent.receive()
    parent.send(identity, dataclasses.replace(flavour.config, settings=settings))
    assert child.outcome() is None
    failed = parent.receive()[1]
    assert isinstance(failed, StartupFailed) and key in failed.message


def test_no_config_in_time_is_a_failed_start(sockets: tuple[Parent, ParentChannel]) -> None:
    parent, channel = sockets
    child = Child(channel, WORKER, timeout_s=0.5)
    parent.receive()
    assert child.outcome() is None
    assert exit_code_without_config(channel.lifecycle) == 2


def test_obey_leaves_other_messages_to_the_loop_and_a_shutdown_sets_the_deadline() -> None:
    lifecycle = Lifecycle()
    sent: list[Message] = []
    assert not lifecycle.obey(WORKER.config, sent.append)
    assert not lifecycle.stop_requested and not sent
    before = time.monotonic()
    assert lifecycle.obey(Shutdown(drain_s=30.0), sent.append)
    assert lifecycle.stop_requested and not sent
    assert lifecycle.drain_deadline is not None and before + 30.0 <= lifecycle.drain_deadline <= time.monotonic() + 30


# ---------------------------------------------------------------- the real children


@pytest.fixture
def runtime() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="chd-", dir="/tmp"))  # ipc paths stay short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _spawn(flavour: Flavour, address: str, log: Path) -> subprocess.Popen:
    package, identity = ("worker", "m#1") if flavour is WORKER else ("kvstore", "kvstore#1")
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", package, "--connect", address, "--identity", identity],
                                cwd=REPO, stdout=out, stderr=out, stdin=subprocess.DEVNULL)


@FLAVOURS
@pytest.mark.parametrize("stop", ["shutdown", "sigterm"])
def test_the_real_child_stops_when_told_to_during_the_handshake(context: zmq.Context, runtime: Path,
                                                                flavour: Flavour, stop: str) -> None:
    """The router stops a child that has said Hello but has no config yet (the service is
    shutting down): it must exit at once with 0, not sit out the 60 s handshake timeout
    and then be killed."""
    address = f"ipc://{runtime}/c"
    parent = Parent(context, address)
    log = runtime / "child.log"
    process = _spawn(flavour, address, log)
    try:
        identity, hello = parent.receive(timeout_s=60)
        assert isinstance(hello, Hello) and hello.role == flavour.role and hello.pid == process.pid
        if stop == "shutdown":
            parent.send(identity, Shutdown(drain_s=5.0))
        else:
            process.send_signal(signal.SIGTERM)
        try:
            returncode = process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the {flavour.role} ignored the {stop} during the handshake:\n{log.read_text()[-2000:]}")
        assert returncode == 0, log.read_text()[-2000:]
        assert "Traceback" not in log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        parent.socket.close(linger=0)
