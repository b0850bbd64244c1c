"""The cache-equality tests can fail: on the real model, a hit equals scratch, and the same
hit with one cached block perturbed does not. So "hit == scratch" passes because the cached
K/V are right, not because the answer ignores them.

Runs in a fresh interpreter that binds the fast BLAS before MLX loads, as the worker does
(in the test process MLX is already loaded on the reference BLAS, ~30x slower).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]

SCENARIO = """
import json, sys
from worker.blas import bind_fast_blas
bind_fast_blas()
from dataclasses import replace
import mlx.core as mx
from protocol.block_keys import chain_keys
from protocol.messages import AddRequest, SamplingParams
from tests.worker.test_prefix_cache import BLOCK, Harness, chat
from worker.kv_blocks import BlockPayload
from worker.model_loader import load_for_serving

real = load_for_serving(sys.argv[1])
question = chat("What is topic 3? Answer in one sentence.")
scratch, _ = Harness(real, cache=False).ask(question, max_tokens=16)
h = Harness(real)
h.ask(question, max_tokens=16)
hit, hit_finish = h.ask(question, max_tokens=16)
# the negative control: the same hit with one early block's keys negated in every layer
ids = h.engine.questions.prompt_ids(AddRequest("probe", messages=question, sampling=SamplingParams()))
key = chain_keys(real.fingerprint, ids, BLOCK, None)[1]
payload, nbytes = h.cache.hot._entries[key]
layers = tuple(replace(layer, arrays=(-layer.arrays[0], *layer.arrays[1:])) for layer in payload.layers)
h.cache.hot._entries[key] = (BlockPayload(layers, payload.nbytes), nbytes)
wrong, wrong_finish = h.ask(question, max_tokens=16)
print(json.dumps({"scratch": scratch, "hit": hit, "wrong": wrong, "block": BLOCK,
                  "hit_cached": hit_finish.usage.cached_tokens, "wrong_cached": wrong_finish.usage.cached_tokens}))
"""


def test_a_perturbed_block_changes_the_answer(default_model_dir: Path) -> None:
    done = subprocess.run([sys.executable, "-c", SCENARIO, str(default_model_dir)], cwd=REPO, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    block = result["block"]
    assert result["hit_cached"] >= 4 * block and result["wrong_cached"] >= 4 * block  # both served from cache
    assert result["hit"] == result["scratch"]  # the positive: cached, same tokens
    assert result["wrong"] != result["scratch"], "a wrong cached block went unnoticed: the equality test could not fail"
