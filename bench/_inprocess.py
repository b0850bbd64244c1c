"""The engine's ceiling: mlx-lm's BatchGenerator in this process, no server around it.

A child of the benchmark (`python bench/_inprocess.py`), because BLAS must be bound
before MLX is imported. JSON lines: the first line on stdin is the spec; the child loads,
warms up and answers one line with its environment; then every line of prompts is run as
one batch and answered with one line of timings. The parent paces the runs (it waits for
an idle machine and meters other load around each one). EOF ends the child.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import json
import sys
import time
from typing import Any


def bind_blas(path: str | None) -> str:
    """Load BLAS with RTLD_GLOBAL before MLX so its cblas_* calls resolve to it."""
    if not path:
        return "reference"
    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    return path


def run_batch(model: Any, tokenizer: Any, spec: dict[str, Any], prompts: list[str], max_tokens: int) -> dict[str, Any]:
    """Insert every prompt at once and step until all finish; time each token on arrival."""
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_logits_processors

    bias = {int(k): float(v) for k, v in (spec.get("logit_bias") or {}).items()}
    stop_ids = set(spec.get("stop_token_ids") or [])
    generator = BatchGenerator(
        model,
        stop_tokens=[[t] for t in sorted(stop_ids)],
        completion_batch_size=spec["completion_batch_size"],
        prefill_batch_size=spec["prefill_batch_size"],
        prefill_step_size=spec["prefill_step_size"],
    )
    token_ids = [list(tokenizer.encode(p)) for p in prompts]
    start = time.perf_counter()
    uids = generator.insert(
        token_ids,
        max_tokens=[max_tokens] * len(prompts),
        logits_processors=[make_logits_processors(logit_bias=bias or None) for _ in prompts],
    )
    times: dict[int, list[float]] = {uid: [] for uid in uids}
    counts = dict.fromkeys(uids, 0)
    finished: set[int] = set()
    while len(finished) < len(uids):
        _, responses = generator.next()
        now = time.perf_counter()
        for response in responses:
            times[response.uid].append(now)
            # a stop token ends the sequence but is not generated text (as in the servers)
            if not (response.finish_reason == "stop" and response.token in stop_ids):
                counts[response.uid] += 1
            if response.finish_reason is not None:
                finished.add(response.uid)
    wall = max(t[-1] for t in times.values()) - start
    generator.close()
    mx.clear_cache()
    return {
        "ttft_s": [times[u][0] - start for u in uids],
        "stream_decode_tok_s": [
            (counts[u] - 1) / (times[u][-1] - times[u][0]) for u in uids
            if counts[u] > 1 and times[u][-1] > times[u][0]
        ],
        "completion_tokens": [counts[u] for u in uids],
        "prompt_tokens": [len(t) for t in token_ids],
        "inter_token_s": [b - a for u in uids for a, b in zip(times[u], times[u][1:])],
        "wall_s": wall,
    }


def _answer(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


def main() -> int:
    spec = json.loads(sys.stdin.readline())
    blas = bind_blas(spec.get("blas"))
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm import load

    model, tokenizer = load(spec["model_dir"])
    # the same model code as mlxd's worker: its CPU kernels, when built ("mlx" otherwise)
    sys.path.insert(0, spec["repo"])
    from worker.cpu_kernels import install

    attention = install()
    dtypes = sorted({str(v.dtype).removeprefix("mlx.core.") for _, v in tree_flatten(model.parameters())})
    run_batch(model, tokenizer, spec, [spec["warmup_prompt"]], spec.get("warmup_max_tokens", 8))
    _answer({
        "blas": blas,
        "attention": attention,
        "dtype": ",".join(dtypes),
        "device": str(mx.default_device()),
        "mlx": mx.__version__,
        "mlx_lm": importlib.metadata.version("mlx-lm"),
    })
    for line in sys.stdin:
        if line.strip():
            prompts = json.loads(line)["prompts"]
            _answer(run_batch(model, tokenizer, spec, prompts, spec["max_tokens"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
