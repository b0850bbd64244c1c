"""`python -m kvstore` as the workers see it: over a DEALER socket, through crashes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from kvstore.config import parse_bytes
from kvstore.segments import list_segments, scan_segment
from protocol.messages import (
    KVClear,
    KVClearResult,
    KVFlush,
    KVFlushResult,
    KVGet,
    KVGetResult,
    KVLookup,
    KVLookupResult,
    KVStats,
    KVStatsResult,
)
from protocol.sockets import make_runtime_dir
from tests.kvstore.helpers import REPO, KVClient, KVProcess, disk_bytes, key, payload

pytestmark = pytest.mark.timeout(60)

BLOCK = 32 << 10


def _flush(client: KVClient) -> None:
    answer, _ = client.ask(KVFlush(client.next_id()))
    assert isinstance(answer, KVFlushResult)


def _get(client: KVClient, namespace: str, keys: list[bytes]) -> list[bytes | None]:
    answer, frames = client.ask(KVGet(client.next_id(), namespace, keys))
    assert isinstance(answer, KVGetResult) and len(answer.found) == len(keys)
    assert len(frames) == sum(answer.found)
    it = iter(frames)
    return [next(it) if found else None for found in answer.found]


def _stats(client: KVClient) -> dict:
    answer, _ = client.ask(KVStats(client.next_id()))
    assert isinstance(answer, KVStatsResult)
    return answer.stats


def test_put_flush_get_lookup_stats_clear(kv_process: KVProcess, kv_client: KVClient) -> None:
    kv_process.start()
    blocks = [(key(i), payload(i, BLOCK)) for i in range(20)]
    kv_client.put("m", blocks[:10])
    kv_client.put("m", blocks[10:])  # many blocks per message
    kv_client.put("other", blocks[:1])
    _flush(kv_client)
    keys = [k for k, _ in blocks]
    assert _get(kv_client, "m", keys + [key(99)]) == [p for _, p in blocks] + [None]
    answer, _ = kv_client.ask(KVLookup(kv_client.next_id(), "m", keys[:5] + [key(99)] + keys[5:]))
    assert isinstance(answer, KVLookupResult) and answer.num_found == 5
    stats = _stats(kv_client)
    assert stats["num_blocks"] == 21 and stats["puts"] == 21 and stats["num_segments"] >= 1
    assert stats["namespaces"]["m"]["blocks"] == 20 and stats["namespaces"]["other"]["blocks"] == 1
    assert stats["disk_bytes"] > 0 and stats["pending_puts"] == 0
    answer, _ = kv_client.ask(KVClear(kv_client.next_id(), "other"))
    assert isinstance(answer, KVClearResult) and answer.num_removed == 1
    answer, _ = kv_client.ask(KVClear(kv_client.next_id(), None))
    assert answer.num_removed == 20
    assert _get(kv_client, "m", keys[:1]) == [None]
    assert kv_process.signal(signal.SIGTERM) == 0


@pytest.mark.parametrize(
    "cap, delay_s",
    [("64MiB", 0.0), ("64MiB", 0.03), ("64MiB", 0.08), ("3MiB", 0.03)],
    ids=["no-eviction-0ms", "no-eviction-30ms", "no-eviction-80ms", "evicting-and-compacting"],
)
def test_sigkill_during_writes_leaves_intact_blocks_or_misses(tmp_path: Path, cap: str, delay_s: float) -> None:
    runtime = make_runtime_dir("kvt-")
    kv_process = KVProcess(tmp_path / "store", runtime, "--max-disk-bytes", cap)
    kv_process.start()
    client = KVClient(kv_process.address)
    try:
        flushed = [(key(i), payload(i, BLOCK)) for i in range(30)]
        client.put("m", flushed)
        _flush(client)
        burst = [(key(i), payload(i, BLOCK)) for i in range(30, 1230)]  # ~40 MB, ~20 MB on disk
        for start in range(0, len(burst), 20):
            client.put("m", burst[start : start + 20])
            if start % 200 == 0:  # hits keep some blocks alive while the rest churns
                client.send(KVLookup(0, "m", [k for k, _ in flushed[:5]]))
        time.sleep(delay_s)
        kv_process.signal(signal.SIGKILL)  # the writer is busy: this lands mid-burst
        client.close()

        kv_process.start()
        client = KVClient(kv_process.address)
        got = _get(client, "m", [k for k, _ in flushed + burst])
        for (_, expected), actual in zip(flushed + burst, got):
            assert actual is None or actual == expected  # never wrong bytes
        if cap == "64MiB":  # nothing evicted: what was flushed before the kill is all there
            assert got[: len(flushed)] == [p for _, p in flushed]
        stats = _stats(client)
        assert stats["corrupt"] == 0
        assert disk_bytes(kv_process.root) <= parse_bytes(cap, "cap") + (256 << 10)
    finally:
        client.close()
        kv_process.stop()
        shutil.rmtree(runtime, ignore_errors=True)


@pytest.mark.parametrize("restart", [False, True], ids=["live", "after-restart"])
def test_flipped_bytes_in_a_segment_make_that_block_a_miss(kv_process: KVProcess, restart: bool) -> None:
    kv_process.start()
    client = KVClient(kv_process.address)
    blocks = [(key(i), payload(i, BLOCK)) for i in range(4)]
    client.put("m", blocks)
    _flush(client)
    if restart:
        assert kv_process.signal(signal.SIGTERM) == 0
    segment = list_segments(kv_process.root / "segments")[1]
    offset, header = scan_segment(segment, verify_payload=True, truncate=False).records[2]
    with open(segment, "r+b") as file:
        file.seek(offset + header.payload_offset + header.stored_bytes // 2)
        data = bytearray(file.read(8))
        file.seek(-8, os.SEEK_CUR)
        file.write(bytes(b ^ 0x5A for b in data))
    if restart:
        client.close()
        kv_process.start()
        client = KVClient(kv_process.address)
    try:
        expected = [p for _, p in blocks]
        expected[2] = None
        assert _get(client, "m", [k for k, _ in blocks]) == expected
        assert _stats(client)["corrupt"] == 1
    finally:
        client.close()


def test_sigterm_writes_pending_puts_before_exiting(kv_process: KVProcess) -> None:
    kv_process.start()
    client = KVClient(kv_process.address)
    blocks = [(key(i), payload(i, BLOCK)) for i in range(100)]
    for start in range(0, len(blocks), 10):
        client.put("m", blocks[start : start + 10])
    _stats(client)  # every put above was received before this answer
    assert kv_process.signal(signal.SIGTERM) == 0  # no flush asked for
    client.close()
    kv_process.start()
    client = KVClient(kv_process.address)
    try:
        assert _get(client, "m", [k for k, _ in blocks]) == [p for _, p in blocks]
    finally:
        client.close()
    assert "closed cleanly" in kv_process.log()


def test_it_exits_when_its_parent_dies(tmp_path: Path) -> None:
    runtime = Path(os.environ.get("TMPDIR", "/tmp"))
    address = f"ipc://{runtime}/kvp-{os.getpid()}"
    parent = subprocess.run(
        [sys.executable, "-c",
         "import subprocess, sys, time; "
         f"p = subprocess.Popen([sys.executable, '-m', 'kvstore', '--bind', {address!r}, '--root', {str(tmp_path)!r}]); "
         "print(p.pid, flush=True); time.sleep(0.5)"],
        cwd=REPO, capture_output=True, text=True, timeout=30,
    )
    child = int(parent.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:  # an orphan's exit may wait a while to be reaped: a zombie counts as gone
            if psutil.Process(child).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("kvstore outlived its parent")
    assert "parent process is gone" in parent.stderr
    Path(address.removeprefix("ipc://")).unlink(missing_ok=True)


def test_streamed_get_sends_block_by_block_and_stops_at_the_first_miss(kv_process: KVProcess,
                                                                       kv_client: KVClient) -> None:
    kv_process.start()
    blocks = [(key(i), payload(i, BLOCK)) for i in range(6)]
    kv_client.put("m", blocks)
    _flush(kv_client)
    asked = [k for k, _ in blocks[:4]] + [key(99)] + [blocks[5][0]]
    request_id = kv_client.next_id()
    kv_client.send(KVGet(request_id, "m", asked, stream=True))
    received = []
    while True:
        answer, frames = kv_client.receive()
        assert isinstance(answer, KVGetResult) and answer.request_id == request_id
        received.append((answer.seq, answer.found, [bytes(f) for f in frames]))
        if answer.done:
            break
    assert [seq for seq, _, _ in received] == [0, 1, 2, 3, 4]
    assert [frames[0] for _, found, frames in received[:4]] == [p for _, p in blocks[:4]]
    assert received[-1][1] == [False] and received[-1][2] == []
