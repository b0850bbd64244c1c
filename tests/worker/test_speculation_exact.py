"""Speculation changes no token: on the real model, greedy answers with prompt lookup on
equal plain decoding token for token (and logprob for logprob), alone and in a batch of 8
that mixes greedy drafting rows with one that cannot draft (logit_bias), a seeded
sampled one and one held by a lazy call grammar, a stop string and logprobs among them; and the check can fail: keeping every draft
unverified changes the answers.

Runs in a fresh interpreter that binds the fast BLAS before MLX loads, as the worker does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[2]
SAMPLED = "r4"  # the seeded sampled request: shares the steps, drafts by the rejection rule

SCENARIO = r"""
import json, sys
from worker.blas import bind_fast_blas
bind_fast_blas()
from tests.worker.speculation_runs import LAZY, run_asks
from worker import draft_planner, speculative_batch
from worker.model_loader import load_for_serving

real = load_for_serving(sys.argv[1])
# the planner's cost stays its prior (no step timed), so which steps widen depends on the
# tokens alone and every run of this test drafts alike
draft_planner.StepCost.record = lambda self, positions, seconds: None
CODE = '''def parse(line):
    name, value = line.split("=", 1)
    return name.strip(), value.strip()

def load(path):
    settings = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                key, val = parse(line)
                settings[key] = val
    return settings
'''
ASKS = [
    ("Rename `settings` to `config` in this code and return the whole file:\n" + CODE, {}),
    ("Repeat this code exactly:\n" + CODE, {"logprobs": True, "top_logprobs": 2}),
    ("Add type hints to this code and return it:\n" + CODE, {}),
    ("Explain what this code does:\n" + CODE, {}),
    ("Write a haiku about the sea.", {"temperature": 0.8, "seed": 7}),
    ("Repeat this code exactly:\n" + CODE, {"stop": ["return name"]}),
    ("Return this code with `load` renamed to `read`:\n" + CODE, {"logit_bias": {"13": -5.0}}),
    ("List the numbers from 1 to 30, comma separated.", {}),
    ("Repeat this code exactly:\n" + CODE, LAZY),  # held by the lazy call grammar
]


def run(speculation, together):
    return run_asks(real, ASKS, speculation, together)[0]


result = {"plain_alone": run("off", False), "spec_alone": run("prompt_lookup", False), "plain_batch": run("off", True)}
# At 8 rows on this CPU a wide step seldom pays (worker/draft_planner.py), so the batch runs
# with every step as wide as its longest draft: the mechanics under test, not the planner
planner = speculative_batch.best_width
speculative_batch.best_width = lambda rows, cost, most=17, extra=None: min(most, 1 + max(n for n, _ in rows))
result["spec_batch"] = run("prompt_lookup", True)
speculative_batch.best_width = planner
speculative_batch.kept_drafts = lambda proposal, best: len(proposal)  # the negative control
result["unverified"] = run("prompt_lookup", False)
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def runs(qwen_model_dir: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", SCENARIO, str(qwen_model_dir)], cwd=REPO, capture_output=True,
                          text=True, timeout=580)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("how", ["alone", "batch"])
def test_speculation_gives_the_plain_tokens_and_logprobs(runs: dict, how: str) -> None:
    plain, spec = runs[f"plain_{how}"], runs[f"spec_{how}"]
    for rid in plain:
        if rid == SAMPLED:  # equal in distribution only: tests/worker/test_speculative_sampling.py
            continue
        assert spec[rid]["ids"] == plain[rid]["ids"], rid
        assert spec[rid]["text"] == plain[rid]["text"], rid
        assert spec[rid]["logprobs"] == plain[rid]["logprobs"], rid
        assert spec[rid]["finish"] == plain[rid]["finish"], rid
    assert runs["spec_alone"]["r5"]["finish"] == "stop"  # the stop string ended it, drafts or not


def test_drafts_were_kept_so_the_equality_means_something(runs: dict) -> None:
    for how in ("alone", "batch"):
        spec = runs[f"spec_{how}"]
        assert spec["r0"]["kept"] >= 10 and spec["r1"]["kept"] >= 10, how  # the copies speculated
        assert spec["r8"]["kept"] >= 10, how  # and so did the copy a lazy call grammar holds
        assert spec["r6"]["drafted"] == 0  # logit_bias: this row never drafts
        assert all(r["drafted"] == 0 for r in runs[f"plain_{how}"].values())


def test_unverified_drafts_change_the_answers(runs: dict) -> None:
    plain, wrong = runs["plain_alone"], runs["unverified"]
    assert any(wrong[rid]["ids"] != plain[rid]["ids"] for rid in plain), \
        "keeping every draft changed nothing: the equality test could not fail"
