"""Sampling settings through the real engine (a tiny random-weight llama): a seeded
request draws the same tokens whatever shares its batch, and a penalty holds over the
whole answer, on the batch's path and on a prefix hit's one-pass prefill."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.messages import AddRequest, SamplingParams
from tests.worker.test_prefix_cache import Harness, chat
from tests.worker.tiny_models import make_tiny
from worker import engine
from worker.prefill import prefill_rest


@pytest.fixture(scope="module")
def tiny(default_model_dir: Path):
    return make_tiny("llama", default_model_dir)


def add(h: Harness, rid: str, question: str = "Tell me about topic 3.", **sampling: object) -> None:
    h.engine.add(AddRequest(rid, messages=chat(question), sampling=SamplingParams(**{"max_tokens": 16, **sampling})))


SEEDED = {"temperature": 1.0, "top_p": 0.95, "seed": 42}


def test_a_seeded_request_draws_the_same_tokens_whatever_shares_its_batch(tiny) -> None:
    alone = Harness(tiny, cache=False)
    add(alone, "x", **SEEDED)
    alone.run()
    crowded = Harness(tiny, cache=False)
    add(crowded, "greedy", "Tell me about topic 9.", temperature=0.0)
    add(crowded, "other-seed", "Tell me about topic 3.", temperature=1.0, seed=43)
    add(crowded, "x", **SEEDED)
    add(crowded, "penalized", "What is topic 5?", temperature=0.8, presence_penalty=1.0, frequency_penalty=0.5)
    crowded.run()
    assert crowded.result("x")[0] == alone.result("x")[0]
    assert crowded.result("other-seed")[0] != alone.result("x")[0]


# 30 tokens the answer is steered to by logit_bias: all far above the model's own logits
# (a tiny random model's are within a few units), a little apart from each other
STEERED = {40_000 + i: 100.0 - 0.5 * i for i in range(30)}


def repeats(tokens: list[int]) -> list[int]:
    return sorted({t for i, t in enumerate(tokens) if t in tokens[:i]})


@pytest.mark.parametrize("penalty", [{"presence_penalty": 40.0}, {"frequency_penalty": 40.0},
                                     {"repetition_penalty": 2.0}], ids=["presence", "frequency", "repetition"])
@pytest.mark.parametrize("cache", [False, True], ids=["batch-path", "prefix-hit-path"])
def test_a_penalty_holds_over_the_whole_answer(tiny, cache: bool, penalty: dict[str, float], monkeypatch) -> None:
    """Greedy, steered to 30 tokens: unpenalized it repeats the most biased one; penalized
    (by more than the 30 biases and the logits differ) it must use all 30 once before any
    comes back. A penalty that forgot a token after 20 would bring the first one back at
    the 21st."""
    h = Harness(tiny, cache=cache)
    add(h, "free", temperature=0.0, logit_bias=STEERED, max_tokens=40)
    h.run()
    free, _ = h.result("free")
    assert set(free) <= set(STEERED) and len(set(free)) < 4, free  # the bias alone: a few tokens, repeated
    one_pass: list[int] = []
    monkeypatch.setattr(engine, "prefill_rest", lambda *args: one_pass.append(1) or prefill_rest(*args))
    add(h, "penalized", temperature=0.0, logit_bias=STEERED, max_tokens=40, **penalty)
    h.run()
    tokens, finish = h.result("penalized")
    assert set(tokens) <= set(STEERED) and len(tokens) == 40
    assert sorted(tokens[:30]) == sorted(STEERED), repeats(tokens[:30])
    # with the cache, the answer's first token came from the prefix hit's one-pass prefill
    assert one_pass == ([1] if cache else []) and (finish.usage.cached_tokens > 0) == cache
