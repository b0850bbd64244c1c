"""SSD cold tier: TTFT after a full restart, restoring the prefix from SSD vs recomputing it.

A ~2K-token agent prompt (prefix.py's system prompt and first user turn) is sent once to
mlxd on a fixed home, which computes its blocks and writes them to the kvstore; the
service is stopped gracefully (the kvstore flushes). Then, alternately: a new service on
the same home answers the same prompt from SSD, and a new service with an empty cold-tier
directory recomputes it. TTFT is measured on the client; both answers must equal the
first one (greedy). The same run measures the disk's sequential read bandwidth (file of the
restored KV's size, read with O_DIRECT) and, on the stored records, lz4's ratio and decode
speed and where a restore spends its time. Prints one JSON object; progress on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import mmap
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import lz4.block

from common import (
    emit,
    CpuMeter,
    Server,
    StreamResult,
    environment,
    log,
    mlxd_server,
    prepare_fp32_model,
    run_concurrently,
    stop_gracefully,
    wait_for_quiet,
)
from kvstore.segments import COMPRESSION_LZ4, RecordHeader, list_segments, read_record, scan_segment
from prefix import USER_TURNS, system_prompt

BLOCK_TOKENS = 256  # mlxd's default --block-tokens (not overridden here)
MIN_DISK_TEST_BYTES = 64 * 1000 * 1000  # smaller reads say more about latency than bandwidth
# sizes of one read; the best median counts (this virtio disk is noisy and does not favour
# one size); the kvstore itself reads a whole record (~12 MB here) per pread
READ_CHUNK_BYTES = (1 << 20, 4 << 20, 16 << 20)
TARGET_SPEEDUP = 8.0
TARGET_FRACTION = 0.5
_RESTORED = re.compile(r"restored (\d+) blocks \(([\d.]+) MB\) from SSD in (\d+) ms")


# ---------------------------------------------------------------- page cache and the disk


def drop_page_cache() -> bool:
    """sync + drop clean page cache (root only); True if it was done."""
    if os.geteuid() != 0:
        return False
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as file:
            file.write("3\n")
    except OSError:
        return False
    return True


def _write_test_file(path: Path, size: int) -> None:
    chunk = os.urandom(4 << 20)  # incompressible; ext4 stores it as is
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        left = size
        while left > 0:
            left -= os.write(fd, chunk[: min(left, len(chunk))])
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_all(path: Path, flags: int, chunk_bytes: int) -> tuple[int, float]:
    """Sequential reads of `chunk_bytes` into a page-aligned buffer (what O_DIRECT needs)."""
    buffer = mmap.mmap(-1, chunk_bytes)
    fd = os.open(path, os.O_RDONLY | flags)
    try:
        total = 0
        started = time.perf_counter()
        while (n := os.readv(fd, [buffer])) > 0:
            total += n
        return total, time.perf_counter() - started
    finally:
        os.close(fd)
        buffer.close()


def measure_disk_read(directory: Path, size: int, repeats: int = 3) -> dict[str, Any]:
    """Sequential read MB/s of a fresh file on `directory`'s filesystem, bypassing the page
    cache: O_DIRECT if the filesystem takes it, else a dropped page cache, else not at all."""
    path = directory / "disk-read-test.bin"
    _write_test_file(path, size)
    out: dict[str, Any] = {"file_bytes": size, "directory": str(directory)}
    try:
        method, runs = None, {}
        with contextlib.suppress(OSError):
            for chunk in READ_CHUNK_BYTES:
                runs[chunk] = [_read_all(path, os.O_DIRECT, chunk) for _ in range(repeats)]
            method = "O_DIRECT"
        if method is None:
            runs, dropped = {}, False
            for chunk in READ_CHUNK_BYTES:
                runs[chunk] = []
                for _ in range(repeats):
                    dropped = drop_page_cache()
                    runs[chunk].append(_read_all(path, 0, chunk))
            method = "buffered after drop_caches" if dropped else "buffered, page cache NOT bypassed"
        medians = {chunk: statistics.median(n / t / 1e6 for n, t in timed) for chunk, timed in runs.items()}
        out["method"] = method
        out["runs_mb_s_by_chunk_mib"] = {chunk >> 20: [round(n / t / 1e6, 1) for n, t in timed]
                                         for chunk, timed in runs.items()}
        out["disk_read_mb_s"] = round(max(medians.values()), 1)
        # what the kvstore does (buffered pread, kernel readahead) from a cold page cache
        if method == "O_DIRECT" and drop_page_cache():
            total, elapsed = _read_all(path, 0, 16 << 20)
            out["buffered_after_drop_caches_mb_s"] = round(total / elapsed / 1e6, 1)
    finally:
        path.unlink(missing_ok=True)
    return out


# ---------------------------------------------------------------- the service


def request_body(model: str, max_tokens: int) -> dict[str, Any]:
    messages = [{"role": "system", "content": system_prompt()}, {"role": "user", "content": USER_TURNS[0]}]
    return {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}


def warm_up(server: Server) -> None:
    """A short prompt (no whole block: nothing looked up or stored), so the measured request
    does not pay for first-call setup."""
    body = {"model": server.model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2}
    run_concurrently(server.base_url, [body], path="/v1/chat/completions")


def run_service(model_dir: Path, home: Path, label: str, flags: list[str], max_tokens: int,
                drop_cache: bool) -> tuple[dict[str, Any], StreamResult]:
    """Start mlxd on `home`, warm up, (drop the page cache), send the prompt, stop gracefully."""
    wait_for_quiet(60)
    with mlxd_server(model_dir, home=home, extra_args=flags) as server:
        warm_up(server)
        # after startup: the kvstore's open reads (and CRC-checks) its last segment, which
        # would otherwise leave the blocks in the page cache
        dropped = drop_page_cache() if drop_cache else False
        meter = CpuMeter()
        (result,) = run_concurrently(server.base_url, [request_body(server.model, max_tokens)],
                                     path="/v1/chat/completions")
        other = meter.other_cores()
        graceful = stop_gracefully(server)
    extension = result.extension
    cache, timings = extension.get("cache") or {}, extension.get("timings") or {}
    restored = [m.groups() for m in _RESTORED.finditer(server.log_path.read_text(errors="replace"))]
    run = {
        "ttft_s": round(result.ttft_s or 0.0, 3),
        "server_ttft_s": timings.get("ttft_s"),
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "cached_tokens": cache.get("cached_tokens"),
        "ssd_tokens": cache.get("cold_tokens"),
        "ssd_bytes": cache.get("cold_bytes"),
        "ssd_fetch_s": timings.get("cold_fetch_s"),
        "page_cache_dropped": dropped,
        "stopped_gracefully": graceful,
        "other_cores": other,
        "log": str(server.log_path),
    }
    if restored:
        blocks, megabytes, ms = restored[-1]
        run["worker_log_restore"] = {"blocks": int(blocks), "mb": float(megabytes), "ms": int(ms)}
    log("%s: ttft %.2f s (server %.2f s), prompt %s tokens, ssd %s tokens / %s bytes in %s s",
        label, run["ttft_s"], run["server_ttft_s"] or 0.0, run["prompt_tokens"], run["ssd_tokens"],
        run["ssd_bytes"], run["ssd_fetch_s"])
    return run, result


# ---------------------------------------------------------------- the stored records


def stored_records(kv_root: Path) -> list[tuple[Path, int, RecordHeader]]:
    """Every intact record (segment path, offset, header), in the order they were written."""
    records = []
    for _, path in list_segments(kv_root / "segments").items():
        scan = scan_segment(path, verify_payload=False, truncate=False)
        records += [(path, offset, header) for offset, header in scan.records]
    return records


def _median_time(fn: Any, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def analyse_records(kv_root: Path, num_blocks: int) -> dict[str, Any]:
    """lz4 ratio and decode speed on the restored blocks as stored, and each step of a
    restore timed alone: the kvstore's read (cold, then warm: pread, CRC, lz4) and the
    worker's decode into MLX arrays."""
    import mlx.core as mx  # already loaded by prepare_fp32_model; no BLAS involved here

    from worker.block_codec import decode_block

    records = stored_records(kv_root)[:num_blocks]
    fds = {path: os.open(path, os.O_RDONLY) for path, _, _ in records}
    try:
        def kvstore_reads() -> list[bytes]:  # what KVStore.get does per key, minus the index
            return [read_record(fds[p], off, h.record_bytes, h.key, h.namespace) for p, off, h in records]

        dropped = drop_page_cache()
        started = time.perf_counter()
        raws = kvstore_reads()
        read_first_s = time.perf_counter() - started
        stored = [os.pread(fds[p], h.stored_bytes, off + h.payload_offset) for p, off, h in records]
        # lz4 on the real KV blocks, as the kvstore would compress them (it keeps the
        # compressed form only when that saves >= 10%, so float KV is mostly stored raw)
        compressed = [(lz4.block.compress(bytes(raw), store_size=False), len(raw)) for raw in raws]

        def lz4_all() -> None:
            for data, raw_bytes in compressed:
                lz4.block.decompress(data, uncompressed_size=raw_bytes)

        def decode_all() -> None:
            arrays = [a for raw in raws for layer in decode_block(raw).layers for a in layer.arrays]
            mx.eval(arrays)

        lz4_s = _median_time(lz4_all)
        raw_bytes = sum(h.raw_bytes for _, _, h in records)
        stored_bytes = sum(h.stored_bytes for _, _, h in records)
        lz4_raw_bytes = sum(n for _, n in compressed)
        return {
            "num_blocks": len(records),
            "raw_bytes": raw_bytes,
            "stored_payload_bytes": stored_bytes,
            "record_bytes": sum(h.record_bytes for _, _, h in records),
            "num_lz4_records": sum(h.compression == COMPRESSION_LZ4 for _, _, h in records),
            "stored_ratio": round(raw_bytes / stored_bytes, 3) if stored_bytes else None,
            "lz4_ratio": round(lz4_raw_bytes / sum(len(c) for c, _ in compressed), 3) if compressed else None,
            "lz4_decode_gb_s": round(lz4_raw_bytes / lz4_s / 1e9, 2) if compressed and lz4_s > 0 else None,
            "steps_s": {
                "kvstore_read_first": round(read_first_s, 4),
                "kvstore_read_first_page_cache_dropped": dropped,
                "kvstore_read_warm": round(_median_time(kvstore_reads), 4),
                "pread_warm": round(_median_time(
                    lambda: [os.pread(fds[p], h.record_bytes, off) for p, off, h in records]), 4),
                "crc32": round(_median_time(lambda: [zlib.crc32(s) for s in stored]), 4),
                "lz4_decompress": round(lz4_s, 4),
                "decode_block_to_mlx": round(_median_time(decode_all), 4),
            },
        }
    finally:
        for fd in fds.values():
            os.close(fd)


def _disk_usage(kv_root: Path) -> dict[str, int]:
    segments = sum(p.stat().st_size for p in list_segments(kv_root / "segments").values())
    index = kv_root / "index.bin"
    return {"segments_bytes": segments, "index_bytes": index.stat().st_size if index.exists() else 0}


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


# ---------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="restarts per arm (default 3; median reported)")
    parser.add_argument("--max-tokens", type=int, default=16, help="greedy tokens per answer (default 16)")
    parser.add_argument("--no-drop-caches", action="store_true", help="never drop the page cache")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()

    started = time.monotonic()
    env = environment()
    model_dir = prepare_fp32_model()
    drop = not args.no_drop_caches
    # on the filesystem a user's home is on (tempfile's default dir), kept across restarts
    home = Path(tempfile.mkdtemp(prefix="mlxd-restore-"))
    kv_root = home / "kvcache"
    try:
        log("populate: first request on a fresh home computes and stores the prefix")
        populate, first = run_service(model_dir, home, "populate", [], args.max_tokens, drop_cache=False)
        on_disk = _disk_usage(kv_root)
        log("kvstore after populate: %s", on_disk)
        ssd_runs: list[dict[str, Any]] = []
        recompute_runs: list[dict[str, Any]] = []
        for i in range(args.repeats):
            run, result = run_service(model_dir, home, f"ssd #{i + 1}", [], args.max_tokens, drop)
            run["answer_matches"] = result.text == first.text
            if not run["ssd_tokens"]:
                raise RuntimeError(f"restarted service restored nothing from SSD (see {run['log']})")
            ssd_runs.append(run)
            empty = Path(tempfile.mkdtemp(prefix="kvcache-empty-", dir=home))
            try:
                run, result = run_service(model_dir, home, f"recompute #{i + 1}",
                                          ["--kvstore-dir", str(empty)], args.max_tokens, drop)
            finally:
                shutil.rmtree(empty, ignore_errors=True)
            run["answer_matches"] = result.text == first.text
            recompute_runs.append(run)
        mismatched = [r for r in ssd_runs + recompute_runs if not r["answer_matches"]]
        if mismatched:
            log("WARNING: %d answers differ from the first one (greedy)", len(mismatched))

        ssd_bytes = int(_median([r["ssd_bytes"] for r in ssd_runs]) or 0)
        log("disk read bandwidth on %s", home)
        disk = measure_disk_read(home, max(ssd_bytes, MIN_DISK_TEST_BYTES))
        num_blocks = (ssd_runs[0].get("worker_log_restore") or {}).get("blocks") or ssd_runs[0]["ssd_tokens"] // BLOCK_TOKENS
        log("analysing the %d stored blocks", num_blocks)
        records = analyse_records(kv_root, num_blocks)
    finally:
        shutil.rmtree(home, ignore_errors=True)

    ttft_ssd = _median([r["ttft_s"] for r in ssd_runs])
    ttft_recompute = _median([r["ttft_s"] for r in recompute_runs])
    restore_mb_s = _median([r["ssd_bytes"] / r["ssd_fetch_s"] / 1e6 for r in ssd_runs if r["ssd_fetch_s"]])
    speedup = ttft_recompute / ttft_ssd if ttft_ssd else None
    fraction = restore_mb_s / disk["disk_read_mb_s"] if restore_mb_s and disk["disk_read_mb_s"] else None
    fetch_s = _median([r["ssd_fetch_s"] for r in ssd_runs])
    steps = records["steps_s"]
    out: dict[str, Any] = {
        "scenario": "restore",
        "ssd_speedup_vs_recompute": round(speedup, 2) if speedup else None,
        "restore_mb_s": round(restore_mb_s, 1) if restore_mb_s else None,
        "disk_read_mb_s": disk["disk_read_mb_s"],
        "restore_fraction_of_disk_bw": round(fraction, 3) if fraction else None,
        "lz4_ratio": records["lz4_ratio"],
        "lz4_decode_gb_s": records["lz4_decode_gb_s"],
        "targets": {
            "ssd_speedup_min": TARGET_SPEEDUP, "ssd_speedup_met": bool(speedup and speedup >= TARGET_SPEEDUP),
            "restore_fraction_min": TARGET_FRACTION,
            "restore_fraction_met": bool(fraction and fraction >= TARGET_FRACTION),
        },
        "ttft_ssd_median_s": ttft_ssd,
        "ttft_recompute_median_s": ttft_recompute,
        "all_answers_match": not mismatched,
        "prompt_tokens": populate["prompt_tokens"],
        "first_answer": first.text,
        "populate": populate,
        "ssd_runs": ssd_runs,
        "recompute_runs": recompute_runs,
        "kvstore_on_disk_after_populate": on_disk,
        "restored_blocks": records,
        # the service's restore (lookup + get + transfer + decode) against its parts timed alone
        "restore_breakdown_s": {
            "service_ssd_fetch_median": fetch_s,
            "kvstore_read_first": steps["kvstore_read_first"],
            "decode_block_to_mlx": steps["decode_block_to_mlx"],
            "rest_ipc_lookup_copies": (round(fetch_s - steps["kvstore_read_first"] - steps["decode_block_to_mlx"], 4)
                                       if fetch_s else None),
        },
        "disk": disk,
        "recompute_baseline": "same restart, --kvstore-dir set to a new empty directory",
        "page_cache": ("dropped (sync; echo 3 > drop_caches) after each service was ready and warmed up, "
                       "before the measured request, in both arms" if drop and ssd_runs[0]["page_cache_dropped"]
                       else "not dropped"),
        "environment": env,
        "runtime_s": round(time.monotonic() - started, 1),
    }
    emit(out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
