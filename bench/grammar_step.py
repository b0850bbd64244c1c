"""What does constrained decoding cost a decode step, part by part? Measured in one process,
on one running batch, with the parts switched on and off block by block in shuffled order,
so this VM's drift (10-15% within a minute) falls on every arm alike.

One mlx-lm BatchGenerator decodes N rows of the model (EOS never ends them). The model it
calls is wrapped the way the worker wraps it (worker/grammar_batch.py `MaskedModel`), and
each block of steps runs one arm:
- `free`: the forward pass alone;
- `sync`: + reading the tokens the step feeds (the host sync every held batch pays);
- `where`: + one `where` over the batch's logits with an all-allowed mask (the mask's
  upload and application);
- `masks`: + every row's mask computed by llguidance in one executor call (matchers
  inside a JSON string of a json_schema grammar, the costliest common state) and applied;
- `masks_dispatched`: the same, with the forward pass dispatched (`async_eval`) before
  the sync, so its tasks queue behind the step before's and the stream never idles
  while the host reads tokens and builds the rest of the step.
Prints one JSON object: each arm's median step time and its ratio to `free`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from worker.blas import bind_fast_blas  # noqa: E402  (before mlx.core: it binds cblas_*)

BLAS = bind_fast_blas()

import llguidance  # noqa: E402
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from common import REPO  # noqa: E402
from worker.batch_adapter import make_batch_generator  # noqa: E402
from worker.model_loader import load_for_serving  # noqa: E402
from worker.vocabulary import TokenVocabulary  # noqa: E402

ARMS = ("free", "sync", "where", "masks", "masks_dispatched")
SCHEMA = '{"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]}'


class ArmModel:
    """The model as the generator calls it, doing what the current arm adds."""

    def __init__(self, model: Any, rows: int, matchers: list[Any], vocab_size: int) -> None:
        self.model, self.rows, self.matchers, self.vocab_size = model, rows, matchers, vocab_size
        self.arm = "free"
        self.executor = llguidance.LLExecutor(num_threads=2)
        self.words = np.zeros((rows, (vocab_size + 31) // 32), dtype=np.int32)

    def __call__(self, inputs: mx.array, cache: Any = None) -> mx.array:
        logits = self.model(inputs, cache=cache)
        if self.arm == "free" or inputs.shape != (self.rows, 1):
            return logits
        if self.arm.endswith("_dispatched"):
            mx.async_eval(logits)
        inputs.reshape(-1).tolist()
        if self.arm == "sync":
            return logits
        width = logits.shape[-1]
        full = np.ones((self.rows, width), dtype=np.bool_)
        if self.arm.startswith("masks"):
            self.executor.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(self.matchers)],
                                                  self.words.ctypes.data, self.words.shape[1] * 4, self.rows)
            bits = np.unpackbits(self.words.view(np.uint8), axis=1, bitorder="little", count=self.vocab_size)
            full[:, : self.vocab_size] = bits.view(np.bool_)
        return mx.where(mx.array(full).reshape(logits.shape), logits, mx.array(-mx.inf, dtype=logits.dtype))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", type=Path, nargs="?",
                        help="an mlx-lm model directory (default: Qwen2.5-Coder-0.5B, 152k tokens, from the tests' home)")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=25, help="blocks per arm (default 25)")
    parser.add_argument("--block", type=int, default=6, help="steps measured per block (default 6)")
    args = parser.parse_args(argv)

    if args.model_dir is None:
        from models.catalog import find_model
        from models.provision import provision_model

        home = Path(os.environ.get("MLXD_TEST_HOME", REPO / ".cache" / "test-home"))
        args.model_dir = provision_model(home, find_model("qwen2.5-coder-0.5b"))
    loaded = load_for_serving(args.model_dir)
    tokenizer = loaded.tokenizer
    vocab_size = int(loaded.config.get("vocab_size") or len(tokenizer))
    vocabulary = TokenVocabulary(tokenizer, vocab_size, sorted(tokenizer.eos_token_ids))
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)
    matchers = []
    for _ in range(args.rows):
        matcher = llguidance.LLMatcher(vocabulary.llg, grammar)
        matcher.consume_tokens(vocabulary.llg.tokenize_str('{"note": "the weather in'))
        matchers.append(matcher)
    model = ArmModel(loaded.model, args.rows, matchers, vocab_size)
    generator = make_batch_generator(model, eos_token_ids=[], max_num_seqs=args.rows, prefill_chunk_tokens=512)
    prompts = [tokenizer.encode(f"Tell story number {i} about a lighthouse keeper.") for i in range(args.rows)]
    generator.insert(prompts, max_tokens=[1 << 30] * args.rows)
    while len(generator.next()[1]) < args.rows:
        pass
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    order = list(ARMS)
    for _ in range(args.repeats):
        random.shuffle(order)
        for arm in order:
            model.arm = arm
            for step in range(args.block + 2):  # the first two steps straddle the switch
                started = time.perf_counter()
                generator.next()
                if step >= 2:
                    times[arm].append(time.perf_counter() - started)
    free = statistics.median(times["free"])
    report = {
        "benchmark": "grammar_step",
        "setup": {"model_dir": str(args.model_dir), "rows": args.rows, "vocab_size": vocab_size,
                  "dtype": loaded.dtype, "quantization": loaded.quantization, "kernels": loaded.attention,
                  "blas": BLAS, "repeats": args.repeats, "block": args.block, "schema": json.loads(SCHEMA)},
        "step_ms_median": {arm: round(1e3 * statistics.median(t), 2) for arm, t in times.items()},
        "ratio_vs_free": {arm: round(free / statistics.median(t), 3) for arm, t in times.items()},
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
