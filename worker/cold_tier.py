"""The worker's client of the kvstore (SSD cold tier).

Reads are one streamed get for a run of blocks (the kvstore sends each block as it reads
it), with a deadline: a slow or dead kvstore is a miss, never a failed request, and after a missed deadline reads are skipped for a
back-off period, so a hung kvstore stalls the engine loop once, not once per prompt.
Writes are write-behind on a thread with its own socket: the engine hands blocks over and
goes on decoding; when the hand-over queue or the socket is full the block is dropped and
counted.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import zmq

from protocol.block_keys import BlockKey
from protocol.codec import decode, encode
from protocol.errors import ProtocolError
from protocol.messages import (
    KVFlush,
    KVFlushResult,
    KVGet,
    KVGetResult,
    KVProbe,
    KVProbeResult,
    KVPut,
    KVSnapshots,
    KVSnapshotsResult,
    Message,
)
from protocol.sockets import make_socket
from worker.block_codec import decode_block, encode_block
from worker.kv_blocks import BlockPayload

log = logging.getLogger(__name__)

_QUEUE_BLOCKS = 256
# Encoded blocks the writer's socket holds for the kvstore; past it puts are dropped. ZeroMQ's
# default (1000 messages) would let a hung kvstore pile up gigabytes of copies in the worker.
_SOCKET_BLOCKS = 32
_FLUSH_ANSWER_S = 10.0  # a flush waits this long for the kvstore's fsync before giving up


class _Flush:
    """A flush in the write queue: `done` is set once it is over, `ok` if the kvstore
    confirmed that every put before it is on disk."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ok = False


@dataclass
class ColdTierStats:
    fetched_blocks: int = 0
    fetch_s: float = 0.0
    queued_blocks: int = 0
    dropped_blocks: int = 0
    corrupt_blocks: int = 0
    read_timeouts: int = 0
    skipped_fetches: int = 0  # fetch_run calls answered [] at once during a read back-off


class ColdTier:
    """Lookup/fetch/store of blocks for one model namespace in the shared kvstore.

    Reads run on the worker's tokenizer thread (`PrefixCache.read_ahead`), so a slow
    kvstore delays the prompts queued behind the read, not the running streams. After a
    timeout, reads are skipped for `backoff_s`, doubled per consecutive timeout up to
    `backoff_max_s`; the first read that is answered ends the back-off. (The router kills
    and restarts a hung kvstore; this keeps new prompts moving until then, and through a
    kvstore that stays slow.)
    """

    def __init__(self, address: str, namespace: str, read_timeout_s: float = 3.0,
                 backoff_s: float = 5.0, backoff_max_s: float = 60.0) -> None:
        self.address = address
        self.namespace = namespace
        self.read_timeout_s = read_timeout_s
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.stats = ColdTierStats()
        self._num_timeouts = 0  # consecutive; 0 once a read is answered
        self._skip_until = 0.0  # time.monotonic() before which reads are skipped
        self._context = zmq.Context.instance()
        self._socket = self._connect()
        self._read_lock = threading.Lock()
        self._ids = itertools.count(1)
        # (key, payload) to write, a _Flush to flush and signal, None to stop
        self._queue: queue.Queue[tuple[BlockKey, BlockPayload] | _Flush | None] = queue.Queue(_QUEUE_BLOCKS)
        self._abandoned = threading.Event()
        self._writer = threading.Thread(target=self._write_loop, name="cold-tier-writer", daemon=True)
        self._writer.start()

    def _connect(self) -> zmq.Socket:
        return make_socket(self._context, zmq.DEALER, self.address, bind=False)

    # ------------------------------------------------------------ reads

    def fetch_run(self, keys: Sequence[BlockKey]) -> list[BlockPayload]:
        """Payloads of the longest run of `keys`, from the first, that the kvstore has."""
        return self.decode_run(self.fetch_raw_run(keys))

    def fetch_raw_run(self, keys: Sequence[BlockKey]) -> list[memoryview]:
        """The longest run of `keys`, from the first, as the kvstore stores them (encoded).

        One streamed get: the kvstore sends block by block and stops at the first miss.
        Safe to call from any thread (the worker reads ahead on its tokenizer thread): the
        read socket is used under a lock, and no MLX array is made here; `decode_run`
        makes them, on the engine's thread.
        """
        if not keys:
            return []
        with self._read_lock:
            if time.monotonic() < self._skip_until:
                self.stats.skipped_fetches += 1
                return []
            started = time.perf_counter()
            run = self._read_stream(list(keys))
            self.stats.fetch_s += time.perf_counter() - started
            return run

    def _read_stream(self, keys: list[BlockKey]) -> list[memoryview]:
        request_id = next(self._ids)
        self._socket.send_multipart(encode(KVGet(request_id, self.namespace, keys, stream=True)))
        run: list[memoryview] = []
        deadline = time.monotonic() + self.read_timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self._socket.poll(int(left * 1000) + 1):
                self._timed_out()
                return run
            try:
                answer, frames = decode(self._socket.recv_multipart(copy=False))
            except ProtocolError as exc:
                log.warning("bad answer from kvstore: %s", exc)
                continue
            if not isinstance(answer, KVGetResult) or answer.request_id != request_id:
                continue  # a late answer to an earlier, abandoned request
            self._answered()
            if answer.found and answer.found[0] and frames and len(run) == answer.seq:
                run.append(frames[0].buffer)  # the view keeps its frame alive
            if answer.done:
                return run
            deadline = time.monotonic() + self.read_timeout_s  # per block, not per run

    def probe(self, keys: Sequence[BlockKey]) -> list[bool] | None:
        """Which of `keys` the kvstore holds, each on its own, without using them (no last
        use changes there); None if it does not answer, or reads are backing off (then a
        request would not read from it either). Safe from any thread, like reads."""
        if not keys:
            return []
        answer = self._ask(KVProbe(next(self._ids), self.namespace, list(keys)), KVProbeResult)
        return answer.found if answer is not None and len(answer.found) == len(keys) else None

    def snapshots(self) -> list[dict] | None:
        """This model's named snapshots as the kvstore keeps them (name, keys, ...); None
        if it does not answer."""
        answer = self._ask(KVSnapshots(next(self._ids), self.namespace), KVSnapshotsResult)
        return answer.snapshots if answer is not None else None

    def _ask(self, question: KVProbe | KVSnapshots, answer_type: type[Message]) -> Any:
        """One question and its answer on the read socket, within the read deadline."""
        with self._read_lock:
            if time.monotonic() < self._skip_until:
                return None
            self._socket.send_multipart(encode(question))
            deadline = time.monotonic() + self.read_timeout_s
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not self._socket.poll(int(left * 1000) + 1):
                    self._timed_out()
                    return None
                try:
                    answer, _ = decode(self._socket.recv_multipart(copy=False))
                except ProtocolError as exc:
                    log.warning("bad answer from kvstore: %s", exc)
                    continue
                if isinstance(answer, answer_type) and getattr(answer, "request_id", None) == question.request_id:
                    self._answered()
                    return answer  # anything else is a late answer to an earlier, abandoned request

    def decode_run(self, run: Sequence[bytes | memoryview]) -> list[BlockPayload]:
        """Encoded blocks -> payloads, up to the first that does not decode (a damaged
        block is a miss from there on, never wrong tokens)."""
        payloads: list[BlockPayload] = []
        for data in run:
            try:
                payloads.append(decode_block(data))
            except ValueError as exc:
                self.stats.corrupt_blocks += 1
                log.warning("unusable block from kvstore (%s); recomputing from there", exc)
                break
        self.stats.fetched_blocks += len(payloads)
        return payloads

    def _timed_out(self) -> None:
        """Start (or lengthen) the read back-off, and drop the socket with any late answer."""
        self.stats.read_timeouts += 1
        skip_s = min(self.backoff_s * 2**self._num_timeouts, self.backoff_max_s)
        self._num_timeouts += 1
        self._skip_until = time.monotonic() + skip_s
        log.warning("kvstore did not answer within %.1f s (%d times in a row); skipping SSD reads for %.1f s",
                    self.read_timeout_s, self._num_timeouts, skip_s)
        self._socket.close(linger=0)  # drop any late answer with the socket
        self._socket = self._connect()

    def _answered(self) -> None:
        """The kvstore answers: end the back-off (its length starts over at the next timeout)."""
        if self._num_timeouts:
            log.info("kvstore answers again; SSD reads resume (%d skipped so far)", self.stats.skipped_fetches)
        self._num_timeouts = 0

    # ------------------------------------------------------------ writes

    def store(self, key: BlockKey, payload: BlockPayload | bytes) -> None:
        """Hand a block over for writing (or bytes stored as they are: a first block's
        shadow, `worker.miss_reasons`); never blocks the caller."""
        try:
            self._queue.put_nowait((key, payload))
            self.stats.queued_blocks += 1
        except queue.Full:
            self.stats.dropped_blocks += 1

    def _write_loop(self) -> None:
        # serializing blocks is background work: let the decode loop have the core
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        socket = make_socket(self._context, zmq.DEALER, self.address, bind=False)
        socket.setsockopt(zmq.SNDHWM, _SOCKET_BLOCKS)
        try:
            while True:
                item = self._queue.get()
                if item is None or self._abandoned.is_set():
                    return
                if isinstance(item, _Flush):
                    item.ok = self._flush_on(socket)
                    item.done.set()
                    continue
                key, payload = item
                try:
                    data = payload if isinstance(payload, bytes) else encode_block(payload)
                except ValueError as exc:
                    log.warning("block not stored on SSD: %s", exc)
                    continue
                try:
                    socket.send_multipart(encode(KVPut(self.namespace, [key]), [data]), flags=zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    self.stats.dropped_blocks += 1
        finally:
            socket.close(linger=0 if self._abandoned.is_set() else 2000)

    def _flush_on(self, socket: zmq.Socket) -> bool:
        """KVFlush on the writer's own socket: the kvstore answers once every put sent
        before it on this connection is on disk. Takes at most _FLUSH_ANSWER_S: a hung
        kvstore leaves the socket full, so even this send must not block."""
        request_id = next(self._ids)
        try:
            socket.send_multipart(encode(KVFlush(request_id)), flags=zmq.NOBLOCK)
        except zmq.Again:
            log.warning("kvstore is not taking writes (its socket is full); blocks still queued there are lost")
            return False
        deadline = time.monotonic() + _FLUSH_ANSWER_S
        while (left := deadline - time.monotonic()) > 0 and socket.poll(int(left * 1000) + 1):
            with contextlib.suppress(ProtocolError):
                answer, _ = decode(socket.recv_multipart())
                if isinstance(answer, KVFlushResult) and answer.request_id == request_id:
                    return True
        log.warning("kvstore did not confirm the flush within %.0f s", _FLUSH_ANSWER_S)
        return False

    def flush(self, timeout_s: float = 15.0) -> bool:
        """Wait at most `timeout_s` until every block handed over so far is on disk
        (graceful shutdown); False if the kvstore did not confirm that in time."""
        deadline = time.monotonic() + timeout_s
        request = _Flush()
        try:
            self._queue.put(request, timeout=timeout_s)
        except queue.Full:
            return False
        return request.done.wait(max(0.0, deadline - time.monotonic())) and request.ok

    def close(self) -> None:
        """Stop the writer (it sends what is queued first) and close the read socket. Waits
        at most a few seconds: a writer stuck behind a hung kvstore is left to die with the
        process (it is a daemon thread)."""
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=5)
        self._writer.join(timeout=5)
        self._socket.close(linger=0)

    def abandon(self, timeout_s: float = 0.5) -> None:
        """Stop without writing what is still queued (dropped and counted), waiting at
        most `timeout_s`: for a worker whose router, and so its kvstore, is gone."""
        self._abandoned.set()
        with contextlib.suppress(queue.Empty):
            while True:
                if isinstance(self._queue.get_nowait(), tuple):
                    self.stats.dropped_blocks += 1
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)
        self._writer.join(timeout=timeout_s)
        self._socket.close(linger=0)

    def drop_queued(self) -> int:
        """Drop the blocks handed over but not yet sent (a cache clear); returns how many.
        A block the writer is sending right now still goes out. Called on the engine's
        thread, the only one that queues, so what is kept goes back in its order."""
        kept: list[_Flush | None] = []
        num_dropped = 0
        with contextlib.suppress(queue.Empty):
            while True:
                item = self._queue.get_nowait()
                if isinstance(item, tuple):
                    num_dropped += 1
                else:
                    kept.append(item)
        for item in kept:
            self._queue.put_nowait(item)
        return num_dropped

    def queue_depth(self) -> int:
        return self._queue.qsize()
