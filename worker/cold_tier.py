"""The worker's client of the kvstore (SSD cold tier).

Reads are one streamed get for a run of blocks (the kvstore sends each block as it reads
it; the worker decodes while the next arrives), with a deadline: a slow or dead kvstore is a miss, never a failed request. Writes
are write-behind on a thread with its own socket: the engine hands blocks over and goes
on decoding; when the hand-over queue is full the block is dropped and counted.
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

import zmq

from protocol.block_keys import BlockKey
from protocol.codec import decode, encode
from protocol.errors import ProtocolError
from protocol.messages import KVFlush, KVFlushResult, KVGet, KVGetResult, KVPut
from protocol.sockets import make_socket
from worker.block_codec import decode_block, encode_block
from worker.kv_blocks import BlockPayload

log = logging.getLogger(__name__)

_READ_TIMEOUT_MS = 3000
_QUEUE_BLOCKS = 256


@dataclass
class ColdTierStats:
    fetched_blocks: int = 0
    fetch_bytes: int = 0
    fetch_s: float = 0.0
    queued_blocks: int = 0
    dropped_blocks: int = 0
    corrupt_blocks: int = 0
    read_timeouts: int = 0


class ColdTier:
    """Lookup/fetch/store of blocks for one model namespace in the shared kvstore."""

    def __init__(self, address: str, namespace: str) -> None:
        self.address = address
        self.namespace = namespace
        self.stats = ColdTierStats()
        self._context = zmq.Context.instance()
        self._socket = self._connect()
        self._ids = itertools.count(1)
        # (key, payload) to write, a threading.Event to flush and signal, None to stop
        self._queue: queue.Queue[tuple[BlockKey, BlockPayload] | threading.Event | None] = queue.Queue(_QUEUE_BLOCKS)
        self._writer = threading.Thread(target=self._write_loop, name="cold-tier-writer", daemon=True)
        self._writer.start()

    def _connect(self) -> zmq.Socket:
        return make_socket(self._context, zmq.DEALER, self.address, bind=False)

    # ------------------------------------------------------------ reads

    def fetch_run(self, keys: Sequence[BlockKey]) -> list[BlockPayload]:
        """Payloads of the longest run of `keys`, from the first, that the kvstore has.

        One streamed get: the kvstore sends block by block and stops at the first miss, and
        each block is decoded here while the next is still being read and sent."""
        if not keys:
            return []
        started = time.perf_counter()
        request_id = next(self._ids)
        self._socket.send_multipart(encode(KVGet(request_id, self.namespace, list(keys), stream=True)))
        run: list[BlockPayload] = []
        deadline = time.monotonic() + _READ_TIMEOUT_MS / 1000
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self._socket.poll(int(left * 1000) + 1):
                self._timed_out()
                break
            try:
                answer, frames = decode(self._socket.recv_multipart(copy=False))
            except ProtocolError as exc:
                log.warning("bad answer from kvstore: %s", exc)
                continue
            if not isinstance(answer, KVGetResult) or answer.request_id != request_id:
                continue  # a late answer to an earlier, abandoned request
            if answer.found and answer.found[0] and frames and len(run) == answer.seq:
                buffer = frames[0].buffer
                try:
                    run.append(decode_block(buffer))
                    self.stats.fetch_bytes += len(buffer)
                except ValueError as exc:
                    self.stats.corrupt_blocks += 1
                    log.warning("unusable block from kvstore (%s); recomputing from there", exc)
                    self._drain(request_id, answer.done, deadline)
                    break
            if answer.done:
                break
            deadline = time.monotonic() + _READ_TIMEOUT_MS / 1000  # per block, not per run
        self.stats.fetched_blocks += len(run)
        self.stats.fetch_s += time.perf_counter() - started
        return run

    def _drain(self, request_id: int, done: bool, deadline: float) -> None:
        """Read and drop the rest of a streamed answer we no longer want."""
        while not done and (left := deadline - time.monotonic()) > 0 and self._socket.poll(int(left * 1000) + 1):
            with contextlib.suppress(ProtocolError):
                answer, _ = decode(self._socket.recv_multipart(copy=False))
                done = isinstance(answer, KVGetResult) and answer.request_id == request_id and answer.done

    def _timed_out(self) -> None:
        self.stats.read_timeouts += 1
        log.warning("kvstore did not answer within %d ms; treating it as a miss", _READ_TIMEOUT_MS)
        self._socket.close(linger=0)  # drop any late answer with the socket
        self._socket = self._connect()

    # ------------------------------------------------------------ writes

    def store(self, key: BlockKey, payload: BlockPayload) -> None:
        """Hand a block over for writing; never blocks the caller."""
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
        try:
            while True:
                item = self._queue.get()
                if item is None:
                    return
                if isinstance(item, threading.Event):
                    self._flush_on(socket)
                    item.set()
                    continue
                key, payload = item
                try:
                    data = encode_block(payload)
                except ValueError as exc:
                    log.warning("block not stored on SSD: %s", exc)
                    continue
                try:
                    socket.send_multipart(encode(KVPut(self.namespace, [key]), [data]), flags=zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    self.stats.dropped_blocks += 1
        finally:
            socket.close(linger=2000)

    def _flush_on(self, socket: zmq.Socket) -> None:
        """KVFlush on the writer's own socket: the kvstore answers once every put sent
        before it on this connection is on disk."""
        request_id = next(self._ids)
        socket.send_multipart(encode(KVFlush(request_id)))
        deadline = time.monotonic() + 10.0
        while (left := deadline - time.monotonic()) > 0 and socket.poll(int(left * 1000) + 1):
            with_answer, _ = decode(socket.recv_multipart())
            if isinstance(with_answer, KVFlushResult) and with_answer.request_id == request_id:
                return
        log.warning("kvstore did not confirm the flush")

    def flush(self, timeout_s: float = 15.0) -> bool:
        """Wait until every block handed over so far is written (graceful shutdown)."""
        done = threading.Event()
        self._queue.put(done, timeout=timeout_s)
        return done.wait(timeout_s)

    def close(self) -> None:
        self._queue.put(None)
        self._writer.join(timeout=5)
        self._socket.close(linger=0)

    def queue_depth(self) -> int:
        return self._queue.qsize()
