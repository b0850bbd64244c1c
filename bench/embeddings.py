"""Embeddings throughput: texts/s at batch 1, 8 and 32 through the service (one
/v1/embeddings request of N texts at a time, base64 as the openai SDK asks; and 32
clients sending one text each at once, which the worker batches itself) next to the same
model in this process (worker.text_encoder, the code the worker runs, same BLAS), in one run.

  python bench/embeddings.py [--seconds 5] [--out FILE]

Prints one JSON object: per batch size each contender's texts/s and the service's ratio to
in-process, and each contender's setup. The issue's target: >= 0.8x at batch 32.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo: worker, models
sys.path.insert(0, str(Path(__file__).resolve().parent))  # common is a sibling script, not a package

from worker.blas import bind_fast_blas  # noqa: E402  (binds BLAS before MLX loads, as the worker does)

BLAS = bind_fast_blas()

import httpx  # noqa: E402
from common import emit, environment, log, mlxd_server  # noqa: E402

BATCH_SIZES = (1, 8, 32)
SUBJECTS = ["The committee", "A small bakery", "The new library", "Our support team", "The river ferry",
            "A local farmer", "The city council", "The night train"]
ACTIONS = ["announced a change to its opening hours", "reported record demand this winter",
           "asked residents for feedback on the plan", "replaced the old heating system",
           "published a guide for first-time visitors", "delayed the project until spring",
           "hired three more people for the weekend", "lowered prices on most items"]


def texts(count: int) -> list[str]:
    """`count` distinct sentences of 12-20 tokens: what a RAG indexer sends."""
    return [f"{SUBJECTS[i % 8]} {ACTIONS[(i // 8 + i) % 8]} after {i + 2} weeks of discussion." for i in range(count)]


def rate(run: Callable[[], None], num_texts: int, seconds: float) -> dict[str, Any]:
    """texts/s of `run` (num_texts per call): two warm-up calls, then calls for `seconds`."""
    for _ in range(2):
        run()
    calls, started = 0, time.perf_counter()
    while calls < 3 or time.perf_counter() - started < seconds:
        run()
        calls += 1
    elapsed = time.perf_counter() - started
    return {"texts_per_s": round(num_texts * calls / elapsed, 1), "calls": calls, "seconds": round(elapsed, 2)}


def in_process(model_dir: Path, seconds: float) -> dict[str, Any]:
    from worker.text_encoder import TextEncoder

    encoder = TextEncoder(model_dir, "embedding")
    results = {}
    for n in BATCH_SIZES:
        batch = texts(n)
        results[n] = rate(lambda b=batch: encoder.embed(encoder.tokenize(b)), n, seconds)  # type: ignore[misc]
        log("in-process batch %d: %.1f texts/s", n, results[n]["texts_per_s"])
    return results


def through_service(model_dir: Path, seconds: float) -> tuple[dict[str, Any], dict[str, Any]]:
    results: dict[str, Any] = {}
    with (mlxd_server(model_dir, extra_args=["--no-cold-tier"], name="mlxd-embeddings") as server,
          httpx.Client(base_url=server.base_url, timeout=120) as client):
        def request(batch: list[str]) -> None:
            answer = client.post("/v1/embeddings", json={"model": model_dir.name, "input": batch,
                                                         "encoding_format": "base64"})
            answer.raise_for_status()

        for n in BATCH_SIZES:
            batch = texts(n)
            results[n] = rate(lambda b=batch: request(b), n, seconds)  # type: ignore[misc]
            log("service batch %d (one request): %.1f texts/s", n, results[n]["texts_per_s"])
        clients = [httpx.Client(base_url=server.base_url, timeout=120) for _ in range(32)]
        with ThreadPoolExecutor(32) as pool:
            def burst() -> None:
                def one(i: int) -> None:
                    clients[i].post("/v1/embeddings", json={"model": model_dir.name, "input": texts(32)[i],
                                                            "encoding_format": "base64"}).raise_for_status()
                list(pool.map(one, range(32)))

            results["32_clients_x_1"] = rate(burst, 32, seconds)
        log("service, 32 clients x 1 text: %.1f texts/s", results["32_clients_x_1"]["texts_per_s"])
        for c in clients:
            c.close()
        setup = {"command": "mlxd serve --model MODEL --no-cold-tier (bench.common.mlxd_server)",
                 "worker": server.info}
    return results, setup


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measuring time per batch size and contender")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()
    from models.catalog import DEFAULT_EMBEDDING_MODEL
    from models.provision import provision_model

    home = Path(os.environ.get("MLXD_TEST_HOME", Path(__file__).resolve().parents[1] / ".cache" / "test-home"))
    model_dir = provision_model(home, DEFAULT_EMBEDDING_MODEL)
    env = environment()
    local = in_process(model_dir, args.seconds)
    served, service_setup = through_service(model_dir, args.seconds)
    table = {}
    for n in BATCH_SIZES:
        table[f"batch_{n}"] = {"in_process_texts_per_s": local[n]["texts_per_s"],
                               "service_texts_per_s": served[n]["texts_per_s"],
                               "service_over_in_process": round(served[n]["texts_per_s"] / local[n]["texts_per_s"], 3)}
    table["32_clients_x_1"] = {"service_texts_per_s": served["32_clients_x_1"]["texts_per_s"],
                               "over_in_process_batch_32": round(served["32_clients_x_1"]["texts_per_s"]
                                                                 / local[32]["texts_per_s"], 3)}
    result = {
        "scenario": "embeddings",
        "model": model_dir.name,
        "results": table,
        "target": "service >= 0.8x in-process at batch 32",
        "target_met": table["batch_32"]["service_over_in_process"] >= 0.8,
        "setups": {
            "in_process": {"what": "worker.text_encoder.TextEncoder.embed(tokenize(texts)) in this process, float32",
                           "blas": BLAS},
            "service": {"what": "POST /v1/embeddings, one client, N texts per request, encoding_format base64; "
                                "and 32 clients x 1 text at once (worker-side dynamic batching)",
                        **service_setup},
        },
        "raw": {"in_process": local, "service": served},
        "environment": env,
    }
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
