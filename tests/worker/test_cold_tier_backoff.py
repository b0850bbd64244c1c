"""ColdTier against a fake kvstore that stops answering: one read timeout, then reads are
skipped for a back-off that doubles per timeout and ends at the first answer; writes and
flushes never block on it."""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from protocol.block_keys import BlockKey
from protocol.codec import decode, encode
from protocol.messages import KVGet, KVGetResult
from protocol.sockets import ipc_address, make_socket
from worker import cold_tier
from worker.cold_tier import ColdTier

pytestmark = pytest.mark.timeout(60)

KEYS = [BlockKey(bytes([i]) * 16) for i in range(3)]
TIMEOUT_S = 0.3


class FakeKVStore:
    """A ROUTER socket that counts gets and answers each as a miss only while `answering`
    is set; otherwise it reads and ignores them, like a hung kvstore."""

    def __init__(self, address: str) -> None:
        self.answering = threading.Event()
        self.num_gets = 0
        self._stop = threading.Event()
        self._socket = make_socket(zmq.Context.instance(), zmq.ROUTER, address, bind=True)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self._socket.poll(20):
                continue
            identity, *body = self._socket.recv_multipart()
            message, _ = decode(body)
            if not isinstance(message, KVGet):
                continue
            self.num_gets += 1
            if self.answering.is_set():
                answer = KVGetResult(message.request_id, [False], seq=0, done=True)
                self._socket.send_multipart([identity, *encode(answer)])

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._socket.close(linger=0)


@pytest.fixture()
def address() -> str:
    return ipc_address(Path(tempfile.mkdtemp(prefix="kvb-", dir="/tmp")), "kv")


@pytest.fixture()
def kvstore(address: str) -> Iterator[FakeKVStore]:
    fake = FakeKVStore(address)
    yield fake
    fake.close()


def timed_fetch(cold: ColdTier) -> float:
    started = time.monotonic()
    assert cold.fetch_run(KEYS) == []
    return time.monotonic() - started


def test_one_timeout_then_skipped_reads_until_an_answer(kvstore: FakeKVStore, address: str,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    cold = ColdTier(address, "m", read_timeout_s=TIMEOUT_S, backoff_s=1.0, backoff_max_s=4.0)
    try:
        caplog.set_level(logging.INFO, logger=cold_tier.__name__)
        assert timed_fetch(cold) >= TIMEOUT_S  # the first read pays the timeout
        assert (kvstore.num_gets, cold.stats.read_timeouts) == (1, 1)
        for _ in range(5):  # within the back-off: answered at once, the kvstore is not asked
            assert timed_fetch(cold) < 0.05
        assert (kvstore.num_gets, cold.stats.skipped_fetches) == (1, 5)

        kvstore.answering.set()
        time.sleep(1.0)  # the back-off is over: the next read goes to the kvstore again
        assert timed_fetch(cold) < TIMEOUT_S
        assert timed_fetch(cold) < TIMEOUT_S
        assert (kvstore.num_gets, cold.stats.read_timeouts, cold.stats.skipped_fetches) == (3, 1, 5)
        messages = [r.getMessage() for r in caplog.records]
        assert sum("skipping SSD reads" in m for m in messages) == 1
        assert sum("SSD reads resume" in m for m in messages) == 1
    finally:
        cold.close()


def test_the_back_off_doubles_per_timeout_up_to_its_cap_and_restarts_after_an_answer(
        kvstore: FakeKVStore, address: str, caplog: pytest.LogCaptureFixture) -> None:
    cold = ColdTier(address, "m", read_timeout_s=0.1, backoff_s=0.2, backoff_max_s=0.5)
    try:
        caplog.set_level(logging.INFO, logger=cold_tier.__name__)
        lengths = []
        for _ in range(4):
            caplog.clear()
            assert timed_fetch(cold) >= 0.1
            (line,) = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
            lengths.append(line.rsplit("for ", 1)[1])
            assert timed_fetch(cold) < 0.05  # skipped
            time.sleep(0.55)  # past even the longest back-off
        assert lengths == ["0.2 s", "0.4 s", "0.5 s", "0.5 s"]

        kvstore.answering.set()
        assert timed_fetch(cold) < 0.1  # answered: the back-off starts over
        kvstore.answering.clear()
        caplog.clear()
        timed_fetch(cold)
        assert any("skipping SSD reads for 0.2 s" in r.getMessage() for r in caplog.records)
    finally:
        cold.close()


def test_a_late_answer_ends_nothing(kvstore: FakeKVStore, address: str) -> None:
    """An answer that arrives after the timeout belongs to an abandoned read: it must not
    be taken for the answer to the next one (the socket is replaced)."""
    cold = ColdTier(address, "m", read_timeout_s=0.1, backoff_s=0.2, backoff_max_s=0.2)
    try:
        timed_fetch(cold)
        kvstore.answering.set()
        time.sleep(0.25)
        assert timed_fetch(cold) < 0.1
        assert cold.stats.read_timeouts == 1
    finally:
        cold.close()


@pytest.fixture()
def raw_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks are plain bytes here: what matters is the socket, not the encoding."""
    monkeypatch.setattr(cold_tier, "encode_block", lambda payload: payload)


def test_writes_to_a_hung_kvstore_are_dropped_and_flush_returns(raw_blocks: None, address: str) -> None:
    context = zmq.Context.instance()
    hung = context.socket(zmq.ROUTER)
    hung.setsockopt(zmq.RCVHWM, 1)  # takes one message in and then reads no more, like a stopped process
    hung.setsockopt(zmq.RCVBUF, 4096)
    hung.bind(address)
    cold = ColdTier(address, "m")
    try:
        block = b"x" * 256_000
        num_sent = 0
        deadline = time.monotonic() + 20
        while cold.stats.dropped_blocks == 0:  # the socket fills, then puts are dropped
            assert time.monotonic() < deadline, "writes to a hung kvstore were never dropped"
            cold.store(BlockKey(num_sent.to_bytes(16, "big")), block)  # type: ignore[arg-type]
            num_sent += 1
            time.sleep(0.002)
        # what waits in the socket is bounded, not ZeroMQ's default of 1000 blocks
        assert cold.stats.queued_blocks - cold.stats.dropped_blocks < 3 * cold_tier._SOCKET_BLOCKS

        started = time.monotonic()
        assert cold.flush(timeout_s=1.0) is False  # not confirmed, and it returns
        assert time.monotonic() - started < 2.0
        for i in range(2 * cold_tier._QUEUE_BLOCKS):  # the writer still drains its queue: it is not stuck
            cold.store(BlockKey((num_sent + i).to_bytes(16, "big")), block)  # type: ignore[arg-type]
            time.sleep(0.001)
        started = time.monotonic()
        cold.close()  # shutdown returns too
        assert time.monotonic() - started < 11.0
        assert not cold._writer.is_alive()
    finally:
        hung.close(linger=0)
