"""The write-behind thread outlives a disk that refuses fsync (read-only, full, gone):
the failure costs durability until the next sync, which retries the same segments; the
writer keeps answering flushes and storing blocks. The soak's read-only and disk-full
faults used to end the thread, and with it the kvstore."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import zmq

from kvstore.store import KVStore
from kvstore.write_behind import REPLIES_ADDRESS, Put, Reply, Writer, WriteQueue
from protocol.codec import decode
from protocol.messages import KVFlush, KVFlushResult
from tests.kvstore.helpers import key, payload


class FlakyFsync:
    """os.fsync that fails the next `failures` calls with EIO, then works and counts."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0
        self.files: list[int] = []  # the inode each call synced (segments, directories)
        self._real = os.fsync

    def __call__(self, fd: int) -> None:
        self.calls += 1
        self.files.append(os.fstat(fd).st_ino)
        if self.failures:
            self.failures -= 1
            raise OSError(5, "Input/output error")
        self._real(fd)


def test_a_failed_flush_is_retried_by_the_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with KVStore(tmp_path / "store", max_disk_bytes=2 << 20, segment_bytes=256 << 10) as store:
        store.put("m", key(1), payload(1))
        flaky = FlakyFsync(failures=1)
        monkeypatch.setattr(os, "fsync", flaky)
        with pytest.raises(OSError):
            store.flush()
        failed_on = flaky.files[-1]
        flaky.files.clear()
        store.flush()
        assert failed_on in flaky.files, "the segment whose fsync failed was forgotten, not retried"
        assert store.get("m", [key(1)]) == [payload(1)]


def test_the_writer_survives_a_failed_sync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    context = zmq.Context()
    replies = context.socket(zmq.PAIR)
    replies.bind(REPLIES_ADDRESS)
    queue = WriteQueue(max_bytes=16 << 20)
    with KVStore(tmp_path / "store", max_disk_bytes=2 << 20, segment_bytes=256 << 10) as store:
        writer = Writer(store, queue, context)
        writer.start()
        try:
            monkeypatch.setattr(os, "fsync", FlakyFsync(failures=3))
            for i in range(3):
                assert queue.offer(Put("m", [key(i)], [payload(i)], len(payload(i))))
                queue.push(Reply(b"client", KVFlush(request_id=i)))
                assert replies.poll(10_000), "no answer to a flush"
                identity, *frames = replies.recv_multipart()
                answer, _ = decode(frames)
                assert identity == b"client" and isinstance(answer, KVFlushResult) and answer.request_id == i
            assert writer.is_alive() and not writer.failed
            # a put that met the failing disk was dropped and counted; once it works again
            # blocks are stored as before
            assert store.get("m", [key(2)]) == [payload(2)]
            assert store.counters.dropped + sum(p is not None for p in store.get("m", [key(0), key(1)])) == 2
        finally:
            queue.push(None)
            writer.join(10)
            replies.close()
            context.term()
