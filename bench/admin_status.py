"""How fast does `GET /admin/status` answer while 8 streams decode?

Ops scripts poll the status route; it must stay fast while the worker is busy (the
router answers from what it already knows, plus one kvstore stats round trip). Measured
side by side: the same route on an idle service (the baseline) and under load, with
`/health` under load for reference. Prints one JSON object; progress on stderr.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from common import emit, environment, mlxd_server, percentile, prepare_fp32_model, run_concurrently, wait_for_quiet


def poll(url: str, seconds: float, interval_s: float = 0.2) -> list[float]:
    """Latencies (ms) of GET `url` polled for `seconds`."""
    latencies = []
    deadline = time.monotonic() + seconds
    with httpx.Client(timeout=10) as client:
        while time.monotonic() < deadline:
            started = time.perf_counter()
            response = client.get(url)
            latencies.append((time.perf_counter() - started) * 1000)
            response.raise_for_status()
            time.sleep(interval_s)
    return latencies


def summary(latencies: list[float]) -> dict[str, Any]:
    return {
        "samples": len(latencies),
        "p50_ms": round(percentile(latencies, 50) or 0.0, 2),
        "p95_ms": round(percentile(latencies, 95) or 0.0, 2),
        "max_ms": round(max(latencies), 2),
        "mean_ms": round(statistics.fmean(latencies), 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    started = time.monotonic()
    model_dir = prepare_fp32_model()
    wait_for_quiet(60)
    with mlxd_server(model_dir) as server:
        status_url, health_url = f"{server.base_url}/admin/status", f"{server.base_url}/health"
        idle = poll(status_url, 5)
        bodies = [{"model": server.model, "prompt": f"Story {i}: once upon a time, a traveller",
                   "max_tokens": args.max_tokens, "temperature": 0, "logit_bias": {"0": -100, "2": -100}}
                  for i in range(args.streams)]
        results: list[Any] = []
        load = threading.Thread(target=lambda: results.extend(run_concurrently(server.base_url, bodies)))
        load.start()
        time.sleep(3)  # past the prefill: all streams decoding
        running = httpx.get(status_url, timeout=10).json()
        under_load = poll(status_url, 8)
        health_under_load = poll(health_url, 4)
        load.join()
    out = {
        "scenario": "admin_status",
        "status_p95_ms_under_load": None,
        "status_idle": summary(idle),
        "status_under_load": summary(under_load),
        "health_under_load": summary(health_under_load),
        "requests_listed_during_load": len(running["requests"]),
        "streams": args.streams,
        "streams_completed": sum(1 for r in results if r.completion_tokens),
        "environment": environment(),
        "runtime_s": round(time.monotonic() - started, 1),
    }
    out["status_p95_ms_under_load"] = out["status_under_load"]["p95_ms"]
    out["ratio_p95_under_load_vs_idle"] = round(out["status_under_load"]["p95_ms"] / max(out["status_idle"]["p95_ms"], 0.01), 2)
    emit(out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
