"""The kvstore process: a ROUTER socket loop in front of a `KVStore`, and its writer thread.

Gets, lookups, probes, stats and snapshot lists are answered on the socket loop; puts,
flushes, clears, pins and unpins go, in arrival order, through a bounded queue to one
writer thread, so the loop never waits on
the disk. The writer's answers come back to the loop over an inproc socket. Supervised, it
says Hello to the router on a control socket, gets its `KVStoreConfig`, opens the store,
binds, sends `KVStoreReady`, and answers pings on the same loop, so a stuck loop is hung.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

import zmq

from kvstore.store import KVStore
from kvstore.write_behind import REPLIES_ADDRESS, Put, Reply, WriteQueue, Writer
from protocol import log_format
from protocol.block_keys import KEY_BYTES
from protocol.codec import Buffer, decode, encode
from protocol.errors import ProtocolError
from protocol.locks import FileLock, LockHeld, try_lock
from protocol.messages import (
    KVSTORE_ROLE,
    PROTOCOL_VERSION,
    Hello,
    KVClear,
    KVFlush,
    KVGet,
    KVGetResult,
    KVLookup,
    KVLookupResult,
    KVPin,
    KVProbe,
    KVProbeResult,
    KVPut,
    KVSnapshots,
    KVSnapshotsResult,
    KVUnpin,
    KVStats,
    KVStatsResult,
    KVStoreConfig,
    KVStoreReady,
    Message,
    Ping,
    Pong,
    Shutdown,
    StartupFailed,
)
from protocol.settings import SettingError
from protocol.sockets import make_socket

log = logging.getLogger(__name__)

_POLL_MS = 200
_HANDSHAKE_TIMEOUT_S = 60.0  # for the router's answer to Hello
_LOCK_WAIT_S = 5.0  # how long a predecessor on the same root gets to finish exiting
ROOT_LOCK = "kvstore.lock"  # in the root; held by the kvstore serving it


class _Flags:
    """Set by signal handlers only; the loop acts on them."""

    stop_requested = False


# ---------------------------------------------------------------- writer thread


# ---------------------------------------------------------------- socket loop


class _Server:
    def __init__(self, store: KVStore, socket: zmq.Socket, queue: WriteQueue) -> None:
        self.store = store
        self.socket = socket
        self.queue = queue
        self.num_dropped_queue_full = 0

    def handle(self, parts: list[zmq.Frame]) -> None:
        identity = parts[0].bytes
        try:
            message, frames = decode([part.buffer for part in parts[1:]])
        except ProtocolError as exc:
            log.warning("ignoring a bad message: %s", exc)
            return
        if isinstance(message, KVLookup):
            self._reply(identity, KVLookupResult(message.request_id, self.store.lookup(message.namespace, _keys(message.keys))))
        elif isinstance(message, KVGet) and message.stream:
            self._stream_get(identity, message)
        elif isinstance(message, KVGet):
            payloads = self.store.get(message.namespace, _keys(message.keys))
            found = [payload for payload in payloads if payload is not None]
            self._reply(identity, KVGetResult(message.request_id, [p is not None for p in payloads]), found)
        elif isinstance(message, KVPut):
            self._put(message, frames)
        elif isinstance(message, KVProbe):
            self._reply(identity, KVProbeResult(message.request_id, self.store.probe(message.namespace,
                                                                                     _keys(message.keys))))
        elif isinstance(message, KVSnapshots):
            self._reply(identity, KVSnapshotsResult(message.request_id, self.store.snapshots(message.namespace)))
        elif isinstance(message, (KVFlush, KVClear, KVPin, KVUnpin)):
            self.queue.push(Reply(identity, message))
        elif isinstance(message, KVStats):
            self._reply(identity, KVStatsResult(message.request_id, self.stats()))
        else:
            log.warning("ignoring unexpected %s message", message.type)

    def _stream_get(self, identity: bytes, message: KVGet) -> None:
        """Send each block as soon as it is read, stopping at the first miss, so reading,
        sending and the asker's decoding overlap."""
        keys = _keys(message.keys)
        for seq, key in enumerate(keys):
            (payload,) = self.store.get(message.namespace, [key])
            last = payload is None or seq == len(keys) - 1
            result = KVGetResult(message.request_id, [payload is not None], seq=seq, done=last)
            self._reply(identity, result, [payload] if payload is not None else [])
            if last:
                return
        self._reply(identity, KVGetResult(message.request_id, [], seq=0, done=True))

    def _put(self, message: KVPut, frames: list[Buffer]) -> None:
        if len(frames) != len(message.keys) or any(len(key) != KEY_BYTES for key in message.keys):
            log.warning("ignoring a put of %d keys with %d payloads (keys must be %d bytes)",
                        len(message.keys), len(frames), KEY_BYTES)
            return
        put = Put(message.namespace, list(message.keys), frames, sum(len(f) for f in frames))
        if not self.queue.offer(put):
            if self.num_dropped_queue_full % 100 == 0:
                log.warning("write queue full (%d bytes pending); dropping puts", self.queue.pending_bytes)
            self.num_dropped_queue_full += len(message.keys)

    def _reply(self, identity: bytes, message: Message, frames: Sequence[bytes] = ()) -> None:
        self.socket.send_multipart([identity, *encode(message, frames)], copy=False)

    def stats(self) -> dict:
        stats = self.store.stats()
        stats["dropped"] += self.num_dropped_queue_full
        stats["dropped_queue_full"] = self.num_dropped_queue_full
        stats["pending_puts"] = len(self.queue)
        stats["pending_bytes"] = self.queue.pending_bytes
        return stats


def _keys(keys: list[bytes]) -> list[bytes]:
    """Keys of the wrong length can match nothing: they are passed on as misses."""
    return [key if len(key) == KEY_BYTES else b"" for key in keys]


class _Control:
    """The supervised kvstore's DEALER socket to the router: handshake, pings, Shutdown.
    Sends never block: if the router is gone, the parent-death check ends the process."""

    def __init__(self, context: zmq.Context, address: str, identity: str) -> None:
        self.socket = make_socket(context, zmq.DEALER, address, bind=False, identity=identity.encode())

    def send(self, message: Message) -> None:
        try:
            self.socket.send_multipart(encode(message), flags=zmq.NOBLOCK)
        except zmq.Again:
            log.warning("router not reachable; dropped %s", message.type)

    def receive(self) -> Message | None:
        try:
            message, _ = decode(self.socket.recv_multipart())
        except ProtocolError as exc:
            log.error("ignoring a bad message from the router: %s", exc)
            return None
        return message

    def close(self) -> None:
        self.socket.close(linger=1000)  # a last StartupFailed still reaches the router


def run_kvstore(config: KVStoreConfig, parent_pid: int | None = None) -> int:
    """Standalone entry point of `python -m kvstore --bind ... --root ...`: serve `config`
    until SIGTERM or until `parent_pid` (default: the current parent) is gone."""
    flags = _start_process()
    context = zmq.Context()
    try:
        return _open_and_serve(config, parent_pid or os.getppid(), flags, context, None)
    finally:
        context.term()


def run_supervised_kvstore(address: str, identity: str, parent_pid: int | None = None) -> int:
    """Supervised entry point of `python -m kvstore --connect ... --identity ...`: Hello,
    then serve the config the router answers with; returns the process exit code."""
    flags = _start_process()
    parent_pid = parent_pid or os.getppid()
    context = zmq.Context()
    control = _Control(context, address, identity)
    try:
        config = _handshake(control, parent_pid, flags)
        if config is None:
            return 2
        return _open_and_serve(config, parent_pid, flags, context, control)
    finally:
        control.close()
        context.term()


def _start_process() -> _Flags:
    log_format.configure_child_logging("kvstore")
    os.umask(0o077)  # the segments hold users' prompts
    flags = _Flags()
    # Background work: writes are write-behind and reads are rare, so on a machine with
    # few cores the kvstore yields the CPU to the workers decoding tokens.
    with contextlib.suppress(OSError):
        os.nice(10)

    def on_signal(signum: int, _frame: object) -> None:
        flags.stop_requested = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return flags


def _handshake(control: _Control, parent_pid: int, flags: _Flags) -> KVStoreConfig | None:
    """Hello, then the router's `KVStoreConfig`; None (logged, and told the router) if it
    does not come, is for another protocol version, or holds a setting out of range."""
    control.send(Hello(protocol_version=PROTOCOL_VERSION, role=KVSTORE_ROLE, pid=os.getpid()))
    deadline = time.monotonic() + _HANDSHAKE_TIMEOUT_S
    while time.monotonic() < deadline and not flags.stop_requested:
        if os.getppid() != parent_pid:
            return None
        if not control.socket.poll(_POLL_MS):
            continue
        message = control.receive()
        if isinstance(message, KVStoreConfig):
            return message if _usable(message, control) else None
        if isinstance(message, Shutdown):
            return None
        if message is not None:
            log.warning("ignoring %s before the configuration", message.type)
    if not flags.stop_requested:
        log.error("no configuration from the router within %.0f s", _HANDSHAKE_TIMEOUT_S)
    return None


def _usable(config: KVStoreConfig, control: _Control) -> bool:
    if config.protocol_version != PROTOCOL_VERSION:
        problem = (f"the router speaks protocol version {config.protocol_version}, the kvstore "
                   f"{PROTOCOL_VERSION}: the installation is inconsistent, reinstall mlxd")
    else:
        try:
            config.settings.check()
            problem = ""
        except SettingError as exc:
            problem = f"bad setting {exc}"
    if problem:
        _startup_failed(control, problem)
    return not problem


def _startup_failed(control: _Control | None, problem: str) -> None:
    log.error("%s", problem)
    if control is not None:
        control.send(StartupFailed(problem))


def _open_and_serve(config: KVStoreConfig, parent_pid: int, flags: _Flags, context: zmq.Context,
                    control: _Control | None) -> int:
    root = Path(config.root)
    try:
        root_lock = _lock_root(root, flags)
    except OSError as exc:
        _startup_failed(control, f"cannot open the store at {root}: {exc} (check kvstore_root / --root)")
        return 2
    if root_lock is None:  # logged by _lock_root
        if control is not None:
            control.send(StartupFailed(f"another kvstore is using {root} (give each service its own kvstore_dir)"))
        return 2
    with root_lock:
        return _run(config, parent_pid, flags, context, control)


def _lock_root(root: Path, flags: _Flags) -> FileLock | None:
    """Lock the store's directory for this process's life, or None if another kvstore
    keeps it: two processes appending to one index and its segments corrupt both.

    A kvstore whose router just died may still be writing its last blocks; the lock is
    waited for briefly, so a service restarted at once gets its cache back."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    deadline = time.monotonic() + _LOCK_WAIT_S
    waiting_logged = False
    while True:
        try:
            return try_lock(root / ROOT_LOCK)
        except LockHeld as exc:
            holder = f"pid {exc.pid}" if exc.pid else "unknown pid"
            if time.monotonic() > deadline or flags.stop_requested:
                log.error("another kvstore (%s) is using %s; not starting a second one on it "
                          "(give each service its own kvstore_dir)", holder, root)
                return None
            if not waiting_logged:
                log.info("waiting for the kvstore (%s) still using %s to exit", holder, root)
                waiting_logged = True
            time.sleep(0.1)


def _run(config: KVStoreConfig, parent_pid: int, flags: _Flags, context: zmq.Context,
         control: _Control | None) -> int:
    settings = config.settings
    try:
        store = KVStore(
            Path(config.root),
            max_disk_bytes=settings.max_disk_bytes,
            segment_bytes=settings.segment_bytes,
            compression=settings.compression,
            namespace_caps=config.namespace_caps,
        )
    except OSError as exc:
        _startup_failed(control, f"cannot open the store at {config.root}: {exc} (check kvstore_root / --root)")
        return 2
    replies = make_socket(context, zmq.PAIR, REPLIES_ADDRESS, bind=True)
    queue = WriteQueue(settings.max_pending_bytes)
    writer = Writer(store, queue, context)
    writer.start()
    socket: zmq.Socket | None = None
    code = 0
    try:
        # bound only once the store is open: a peer that sees the socket can be served
        socket = make_socket(context, zmq.ROUTER, config.bind, bind=True)
        log.info("serving %s on %s", config.root, config.bind)
        if control is not None:
            opened = store.stats()
            control.send(KVStoreReady(PROTOCOL_VERSION, config.root, config.bind, opened["num_blocks"],
                                      opened["disk_bytes"]))
        _serve(_Server(store, socket, queue), replies, writer, control, parent_pid, flags)
        if writer.failed:
            code = 1
    except zmq.ZMQError as exc:
        _startup_failed(control, f"cannot bind {config.bind}: {exc}")
        code = 2
    finally:
        queue.push(None)
        writer.join()
        store.close()
        if socket is not None:
            socket.close()
        replies.close()
        log.info("stopped; store closed cleanly")
    return code


def _serve(server: _Server, replies: zmq.Socket, writer: Writer, control: _Control | None, parent_pid: int,
           flags: _Flags) -> None:
    poller = zmq.Poller()
    poller.register(server.socket, zmq.POLLIN)
    poller.register(replies, zmq.POLLIN)
    if control is not None:
        poller.register(control.socket, zmq.POLLIN)
    while not flags.stop_requested:
        if os.getppid() != parent_pid:
            log.info("parent process is gone; shutting down")
            return
        if not writer.is_alive():
            log.error("writer thread died; shutting down")
            return
        for sock, _ in poller.poll(_POLL_MS):
            if sock is replies:
                server.socket.send_multipart(replies.recv_multipart(copy=False), copy=False)
            elif control is not None and sock is control.socket:
                _obey(control, flags)
            else:
                try:
                    server.handle(server.socket.recv_multipart(copy=False))
                except Exception:  # one bad request must not take the cold tier down
                    log.exception("failed to handle a message")
    log.info("stop requested; flushing %d pending writes", len(server.queue))


def _obey(control: _Control, flags: _Flags) -> None:
    """A message from the router: answered on this loop, so a stuck loop misses its pings."""
    message = control.receive()
    if isinstance(message, Ping):
        control.send(Pong(message.nonce, message.sent_at))
    elif isinstance(message, Shutdown):
        flags.stop_requested = True
    elif message is not None:
        log.warning("ignoring unexpected %s from the router", message.type)
