"""The kvstore process: a ROUTER socket loop in front of a `KVStore`, and its writer thread.

Gets, lookups, probes, stats and snapshot lists are answered on the socket loop; puts,
flushes, clears, pins and unpins go, in arrival order, through a bounded queue to one
writer thread, so the loop never waits on
the disk. The writer's answers come back to the loop over an inproc socket. Supervised, it
says Hello to the router on a control socket (`protocol.child`), gets its `KVStoreConfig`,
opens the store, binds, sends `KVStoreReady`, and answers pings on the same loop, so a
stuck loop is hung.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

import zmq

from kvstore.store import KVStore
from kvstore.write_behind import REPLIES_ADDRESS, Put, Reply, WriteQueue, Writer
from protocol import log_format
from protocol.block_keys import KEY_BYTES
from protocol.child import Lifecycle, ParentChannel, exit_code_without_config
from protocol.codec import Buffer, decode, encode
from protocol.errors import ProtocolError
from protocol.locks import FileLock, LockHeld, try_lock
from protocol.messages import (
    KVSTORE_ROLE,
    PROTOCOL_VERSION,
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
    StartupFailed,
)
from protocol.sockets import make_socket

log = logging.getLogger(__name__)

_POLL_MS = 200
_LOCK_WAIT_S = 5.0  # how long a predecessor on the same root gets to finish exiting
ROOT_LOCK = "kvstore.lock"  # in the root; held by the kvstore serving it


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


def run_kvstore(config: KVStoreConfig, parent_pid: int | None = None) -> int:
    """Standalone entry point of `python -m kvstore --bind ... --root ...`: serve `config`
    until SIGTERM or until `parent_pid` (default: the current parent) is gone."""
    lifecycle = _start_process(parent_pid)
    context = zmq.Context()
    try:
        return _open_and_serve(config, lifecycle, context, None)
    finally:
        context.term()


def run_supervised_kvstore(address: str, identity: str, parent_pid: int | None = None) -> int:
    """Supervised entry point of `python -m kvstore --connect ... --identity ...`: Hello,
    then serve the config the router answers with; returns the process exit code."""
    lifecycle = _start_process(parent_pid)
    context = zmq.Context()
    control = ParentChannel(address, identity, lifecycle, context=context)
    try:
        config = control.handshake(KVSTORE_ROLE, KVStoreConfig)
        if config is None:
            return exit_code_without_config(lifecycle)
        return _open_and_serve(config, lifecycle, context, control)
    finally:
        control.close()
        context.term()


def _start_process(parent_pid: int | None) -> Lifecycle:
    log_format.configure_child_logging("kvstore")
    os.umask(0o077)  # the segments hold users' prompts
    # Background work: writes are write-behind and reads are rare, so on a machine with
    # few cores the kvstore yields the CPU to the workers decoding tokens.
    with contextlib.suppress(OSError):
        os.nice(10)
    lifecycle = Lifecycle(parent_pid)
    lifecycle.install_signal_handlers()
    return lifecycle


def _startup_failed(control: ParentChannel | None, problem: str) -> None:
    if control is not None:
        control.startup_failed(problem)
    else:
        log.error("%s", problem)


def _open_and_serve(config: KVStoreConfig, lifecycle: Lifecycle, context: zmq.Context,
                    control: ParentChannel | None) -> int:
    root = Path(config.root)
    try:
        root_lock = _lock_root(root, lifecycle)
    except OSError as exc:
        _startup_failed(control, f"cannot open the store at {root}: {exc} (check kvstore_root / --root)")
        return 2
    if root_lock is None:  # logged by _lock_root
        if control is not None:
            control.send(StartupFailed(f"another kvstore is using {root} (give each service its own kvstore_dir)"))
        return 2
    with root_lock:
        return _run(config, lifecycle, context, control)


def _lock_root(root: Path, lifecycle: Lifecycle) -> FileLock | None:
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
            if time.monotonic() > deadline or lifecycle.stop_requested:
                log.error("another kvstore (%s) is using %s; not starting a second one on it "
                          "(give each service its own kvstore_dir)", holder, root)
                return None
            if not waiting_logged:
                log.info("waiting for the kvstore (%s) still using %s to exit", holder, root)
                waiting_logged = True
            time.sleep(0.1)


def _run(config: KVStoreConfig, lifecycle: Lifecycle, context: zmq.Context, control: ParentChannel | None) -> int:
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
        _serve(_Server(store, socket, queue), replies, writer, control, lifecycle)
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


def _serve(server: _Server, replies: zmq.Socket, writer: Writer, control: ParentChannel | None,
           lifecycle: Lifecycle) -> None:
    poller = zmq.Poller()
    poller.register(server.socket, zmq.POLLIN)
    poller.register(replies, zmq.POLLIN)
    if control is not None:
        poller.register(control.socket, zmq.POLLIN)
    while not lifecycle.stop_requested:
        if lifecycle.parent_gone():
            log.info("parent process is gone; shutting down")
            return
        if not writer.is_alive():
            log.error("writer thread died; shutting down")
            return
        for sock, _ in poller.poll(_POLL_MS):
            if sock is replies:
                server.socket.send_multipart(replies.recv_multipart(copy=False), copy=False)
            elif control is not None and sock is control.socket:
                _obey(control)
            else:
                try:
                    server.handle(server.socket.recv_multipart(copy=False))
                except Exception:  # one bad request must not take the cold tier down
                    log.exception("failed to handle a message")
    log.info("stop requested; flushing %d pending writes", len(server.queue))


def _obey(control: ParentChannel) -> None:
    """A message from the router: answered on this loop, so a stuck loop misses its pings."""
    message = control.receive(0)
    if message is not None and not control.lifecycle.obey(message, control.send):
        log.warning("ignoring unexpected %s from the router", message.type)
