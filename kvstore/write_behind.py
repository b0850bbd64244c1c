"""The kvstore's write-behind: puts, flushes, clears, pins and unpins queue, in arrival
order, for one writer thread, so the socket loop never waits on the disk; the writer
answers all but puts back to the loop over an inproc socket."""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass

import zmq

from kvstore.store import KVStore
from protocol.codec import Buffer, encode
from protocol.messages import (
    KVClear,
    KVClearResult,
    KVFlush,
    KVFlushResult,
    KVPin,
    KVPinResult,
    KVUnpin,
    KVUnpinResult,
    Message,
)
from protocol.sockets import make_socket

log = logging.getLogger(__name__)

REPLIES_ADDRESS = "inproc://kvstore-writer-replies"
_IDLE_SYNC_S = 2.0  # fsync this long after the last write, when no more are queued


@dataclass
class Put:
    namespace: str
    keys: list[bytes]
    payloads: list[Buffer]
    num_bytes: int


@dataclass
class Reply:
    """A flush, clear, pin or unpin: done in order with the puts before it, then answered."""

    identity: bytes
    message: KVFlush | KVClear | KVPin | KVUnpin


class WriteQueue:
    """FIFO of writer work. Puts are bounded by the bytes they hold: past the bound a
    put is refused (the cold tier is best-effort), while flushes and clears always fit."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.pending_bytes = 0
        self._items: collections.deque[Put | Reply | None] = collections.deque()
        self._ready = threading.Condition()

    def offer(self, put: Put) -> bool:
        with self._ready:
            if self.pending_bytes and self.pending_bytes + put.num_bytes > self.max_bytes:
                return False
            self.pending_bytes += put.num_bytes
            self._items.append(put)
            self._ready.notify()
            return True

    def push(self, item: Reply | None) -> None:
        """Queue a flush or clear; None asks the writer to finish the queue and stop."""
        with self._ready:
            self._items.append(item)
            self._ready.notify()

    def take(self, timeout: float) -> Put | Reply | None | bool:
        """The next item, or False if none came within `timeout`."""
        with self._ready:
            if not self._items and not self._ready.wait(timeout):
                return False
            return self._items.popleft() if self._items else False

    def done(self, put: Put) -> None:
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
        replies = make_socket(self._context, zmq.PAIR, REPLIES_ADDRESS, bind=False)
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
                    dirty = not self._sync()
                continue
            if item is None:
                self._sync()
                return
            if isinstance(item, Put):
                self._put(item)
                last_write, dirty = time.monotonic(), True
                continue
            if isinstance(item.message, KVFlush):
                dirty = not self._sync()
            replies.send_multipart([item.identity, *encode(self._answer(item.message))])

    def _sync(self) -> bool:
        """fsync what was written. A disk that fails it (read-only, full, gone) costs the
        durability of those writes, logged, and never the writer: the kvstore keeps
        serving what it has and retries at the next sync."""
        try:
            self.store.flush()
            return True
        except OSError as exc:
            log.error("cold tier sync failed (retried at the next one): %s", exc)
            return False

    def _answer(self, message: KVFlush | KVClear | KVPin | KVUnpin) -> Message:
        if isinstance(message, KVFlush):
            return KVFlushResult(message.request_id)
        if isinstance(message, KVClear):
            return KVClearResult(message.request_id, self.store.clear(message.namespace))
        if isinstance(message, KVPin):
            try:
                snapshot = self.store.pin(message.name, message.namespace, message.keys, message.info)
            except OSError as exc:
                log.error("snapshot %r not pinned: %s", message.name, exc)
                return KVPinResult(message.request_id, error=f"the pin set could not be saved: {exc}")
            return KVPinResult(message.request_id, error="" if snapshot else "exists", snapshot=snapshot)
        try:
            return KVUnpinResult(message.request_id, self.store.unpin(message.name))
        except OSError as exc:
            log.error("snapshot %r not unpinned: %s", message.name, exc)
            return KVUnpinResult(message.request_id, None, error=f"the pin set could not be saved: {exc}")

    def _put(self, put: Put) -> None:
        try:
            for key, payload in zip(put.keys, put.payloads):
                try:
                    self.store.put(put.namespace, key, payload)
                except (OSError, ValueError) as exc:
                    self.store.counters.dropped += 1
                    log.error("block for %r not stored: %s", put.namespace, exc)
        finally:
            self.queue.done(put)
