"""One bad request fails alone: whatever it trips over inside the engine becomes its own
ErrorEvent, and the batch around it goes on untouched."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.messages import AddRequest, ErrorEvent, SamplingParams
from tests.worker.test_prefix_cache import Harness, chat
from tests.worker.tiny_models import VOCAB, make_tiny
from worker import admission


@pytest.fixture(scope="module")
def tiny(default_model_dir: Path):
    return make_tiny("llama", default_model_dir)


def add(h: Harness, rid: str, **sampling: object) -> None:
    h.engine.add(AddRequest(rid, messages=chat("Tell me about topic 3."),
                            sampling=SamplingParams(**{"max_tokens": 6, **sampling})))


def error_of(h: Harness, rid: str) -> ErrorEvent:
    (event,) = [e for e in h.events if isinstance(e, ErrorEvent) and e.request_id == rid]
    return event


@pytest.mark.parametrize("seed", [-1, -(2**63), 2**64 - 1])
def test_any_64_bit_seed_samples(tiny, seed: int) -> None:
    h = Harness(tiny, cache=False)
    add(h, "a", temperature=1.0, seed=seed)
    add(h, "b", temperature=1.0, seed=seed)
    h.run()
    assert h.result("a")[0] == h.result("b")[0]  # the same seed, the same tokens


def test_the_seed_decides_the_sample(tiny) -> None:
    """What `seed` is for: other seeds, other tokens (a seed ignored for a fixed one
    would pass the test above)."""
    h = Harness(tiny, cache=False)
    for seed in range(4):
        add(h, f"s{seed}", temperature=1.0, seed=seed, max_tokens=12)
    h.run()
    samples = {tuple(h.result(f"s{seed}")[0]) for seed in range(4)}
    assert len(samples) > 1, "every seed sampled the same tokens"


@pytest.mark.parametrize("token_id", [VOCAB, 100_000, 2**31 - 1])
def test_logit_bias_outside_the_vocabulary_fails_that_request_only(tiny, token_id: int) -> None:
    h = Harness(tiny, cache=False)
    add(h, "ok", temperature=0.0)
    add(h, "bad", temperature=0.0, logit_bias={token_id: 5.0})
    h.run()
    error = error_of(h, "bad")
    assert error.status == 400 and error.param == "logit_bias" and str(VOCAB) in error.message
    assert len(h.result("ok")[0]) == 6


def test_an_unforeseen_failure_on_admission_is_a_500_for_that_request(tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    h = Harness(tiny, cache=False)
    add(h, "running", temperature=0.0)
    h.engine.step()
    real = admission.make_request_sampler

    def broken(params: SamplingParams, vocab_size: int):
        if params.top_k == 7:
            raise TypeError("a bug")
        return real(params, vocab_size)

    monkeypatch.setattr(admission, "make_request_sampler", broken)
    add(h, "bad", temperature=1.0, top_k=7)
    add(h, "after", temperature=0.0)
    h.run()
    error = error_of(h, "bad")
    assert error.status == 500 and "TypeError" in error.message
    assert len(h.result("running")[0]) == 6 and len(h.result("after")[0]) == 6
    assert not h.engine.has_work()


def test_a_failure_in_one_sequences_step_fails_it_alone(tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    h = Harness(tiny, cache=False)
    add(h, "a", temperature=0.0)
    add(h, "b", temperature=0.0)
    real = h.engine._on_token

    def on_token(seq, token, finish_reason, now, *distribution):
        if seq.request_id == "b" and seq.num_generated == 2:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "a detokenizer bug")
        real(seq, token, finish_reason, now, *distribution)

    monkeypatch.setattr(h.engine, "_on_token", on_token)
    h.run()
    assert error_of(h, "b").status == 500
    assert len(h.result("a")[0]) == 6
    assert not h.engine.has_work()
