"""The kvstore process: a ROUTER socket loop in front of a `KVStore`, and its writer thread.

Gets, lookups and stats are answered on the socket loop; puts, flushes and clears go, in
arrival order, through a bounded queue to one writer thread, so the loop never waits on
the disk. The writer's answers come back to the loop over an inproc socket.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import zmq

from kvstore.config import KVStoreConfig
from kvstore.store import KVStore
from protocol import log_format
from protocol.block_keys import KEY_BYTES
from protocol.codec import Buffer, decode, encode
from protocol.errors import ProtocolError
from protocol.locks import FileLock, LockHeld, try_lock
from protocol.messages import (
    KVClear,
    KVClearResult,
    KVFlush,
    KVFlushResult,
    KVGet,
    KVGetResult,
    KVLookup,
    KVLookupResult,
    KVPut,
    KVStats,
    KVStatsResult,
    Message,
)
from protocol.sockets import make_socket

log = logging.getLogger(__name__)

_POLL_MS = 200
_REPLIES_ADDRESS = "inproc://kvstore-writer-replies"
_IDLE_SYNC_S = 2.0  # fsync this long after the last write, when no more are queued
_LOCK_WAIT_S = 5.0  # how long a predecessor on the same root gets to finish exiting
ROOT_LOCK = "kvstore.lock"  # in the root; held by the kvstore serving it


class _Flags:
    """Set by signal handlers only; the loop acts on them."""

    stop_requested = False


# ---------------------------------------------------------------- writer thread


@dataclass
class _Put:
    namespace: str
    keys: list[bytes]
    payloads: list[Buffer]
    num_bytes: int


@dataclass
class _Reply:
    """A flush or clear: done in order with the puts before it, then answered."""

    identity: bytes
    message: KVFlush | KVClear


class WriteQueue:
    """FIFO of writer work. Puts are bounded by the bytes they hold: past the bound a
    put is refused (the cold tier is best-effort), while flushes and clears always fit."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.pending_bytes = 0
        self._items: collections.deque[_Put | _Reply | None] = collections.deque()
        self._ready = threading.Condition()

    def offer(self, put: _Put) -> bool:
        with self._ready:
            if self.pending_bytes and self.pending_bytes + put.num_bytes > self.max_bytes:
                return False
            self.pending_bytes += put.num_bytes
            self._items.append(put)
            self._ready.notify()
            return True

    def push(self, item: _Reply | None) -> None:
        """Queue a flush or clear; None asks the writer to finish the queue and stop."""
        with self._ready:
            self._items.append(item)
            self._ready.notify()

    def take(self, timeout: float) -> _Put | _Reply | None | bool:
        """The next item, or False if none came within `timeout`."""
        with self._ready:
            if not self._items and not self._ready.wait(timeout):
                return False
            return self._items.popleft() if self._items else False

    def done(self, put: _Put) -> None:
        with self._ready:
            self.pending_bytes -= put.num_bytes

    def __len__(self) -> int:
        return len(self._items)


class Writer(threading.Thread):
    """Drains the queue into the store; fsyncs on flush and when idle after writes."""

    def __init__(self, store: KVStore, queue: WriteQueue, context: zmq.Context) -> None:
        super().__init__(name="kvstore-writer", daemon=True)
        self.store = store
        self.queue = queue
        self._context = context
        self.failed = False

    def run(self) -> None:
        replies = make_socket(self._context, zmq.PAIR, _REPLIES_ADDRESS, bind=False)
        try:
            self._loop(replies)
        except Exception:
            self.failed = True
            log.exception("writer thread failed")
        finally:
            replies.close()

    def _loop(self, replies: zmq.Socket) -> None:
        last_write = 0.0
        dirty = False
        while True:
            item = self.queue.take(timeout=0.5)
            if item is False:
                if dirty and time.monotonic() - last_write > _IDLE_SYNC_S:
                    self.store.flush()
                    dirty = False
                continue
            if item is None:
                self.store.flush()
                return
            if isinstance(item, _Put):
                self._put(item)
                last_write, dirty = time.monotonic(), True
                continue
            if isinstance(item.message, KVFlush):
                self.store.flush()
                dirty = False
                answer: Message = KVFlushResult(item.message.request_id)
            else:
                answer = KVClearResult(item.message.request_id, self.store.clear(item.message.namespace))
            replies.send_multipart([item.identity, *encode(answer)])

    def _put(self, put: _Put) -> None:
        try:
            for key, payload in zip(put.keys, put.payloads):
                try:
                    self.store.put(put.namespace, key, payload)
                except (OSError, ValueError) as exc:
                    self.store.counters.dropped += 1
                    log.error("block for %r not stored: %s", put.namespace, exc)
        finally:
            self.queue.done(put)


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
        elif isinstance(message, (KVFlush, KVClear)):
            self.queue.push(_Reply(identity, message))
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
        put = _Put(message.namespace, list(message.keys), frames, sum(len(f) for f in frames))
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
    """Entry point of `python -m kvstore`; returns the process exit code. It exits when
    `parent_pid` (default: the current parent) is no longer its parent."""
    log_format.configure_logging(log_format.child_log_level(), "kvstore")
    os.umask(0o077)  # the segments hold users' prompts
    parent_pid = parent_pid or os.getppid()
    flags = _Flags()
    # Background work: writes are write-behind and reads are rare, so on a machine with
    # few cores the kvstore yields the CPU to the workers decoding tokens.
    with contextlib.suppress(OSError):
        os.nice(10)

    def on_signal(signum: int, _frame: object) -> None:
        flags.stop_requested = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    try:
        root_lock = _lock_root(config.root, flags)
    except OSError as exc:
        log.error("cannot open the store at %s: %s (check --root)", config.root, exc)
        return 2
    if root_lock is None:
        return 2
    with root_lock:
        return _run(config, parent_pid, flags)


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
                          "(give each service its own cold_cache_dir)", holder, root)
                return None
            if not waiting_logged:
                log.info("waiting for the kvstore (%s) still using %s to exit", holder, root)
                waiting_logged = True
            time.sleep(0.1)


def _run(config: KVStoreConfig, parent_pid: int, flags: _Flags) -> int:
    try:
        store = KVStore(
            config.root,
            max_disk_bytes=config.max_disk_bytes,
            segment_bytes=config.segment_bytes,
            compression=config.compression,
            namespace_caps=config.namespace_caps,
        )
    except OSError as exc:
        log.error("cannot open the store at %s: %s (check --root)", config.root, exc)
        return 2
    context = zmq.Context()
    replies = make_socket(context, zmq.PAIR, _REPLIES_ADDRESS, bind=True)
    queue = WriteQueue(config.max_pending_bytes)
    writer = Writer(store, queue, context)
    writer.start()
    socket: zmq.Socket | None = None
    code = 0
    try:
        # bound only once the store is open: a peer that sees the socket can be served
        socket = make_socket(context, zmq.ROUTER, config.bind, bind=True)
        log.info("serving %s on %s", config.root, config.bind)
        _serve(_Server(store, socket, queue), replies, writer, parent_pid, flags)
        if writer.failed:
            code = 1
    except zmq.ZMQError as exc:
        log.error("cannot bind %s: %s (check --bind)", config.bind, exc)
        code = 2
    finally:
        queue.push(None)
        writer.join()
        store.close()
        if socket is not None:
            socket.close()
        replies.close()
        context.term()
        log.info("stopped; store closed cleanly")
    return code


def _serve(server: _Server, replies: zmq.Socket, writer: Writer, parent_pid: int, flags: _Flags) -> None:
    poller = zmq.Poller()
    poller.register(server.socket, zmq.POLLIN)
    poller.register(replies, zmq.POLLIN)
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
                continue
            try:
                server.handle(server.socket.recv_multipart(copy=False))
            except Exception:  # one bad request must not take the cold tier down
                log.exception("failed to handle a message")
    log.info("stop requested; flushing %d pending writes", len(server.queue))
