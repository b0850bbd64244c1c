"""Prefill pacing (worker/prefill_pacing.py): chunks shrink to keep a step near its target
time on a slow machine, and an answer prefilled in small chunks equals one prefilled in
big ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.worker.test_prefix_cache import Harness, chat
from tests.worker.tiny_models import make_tiny
from worker.prefill_pacing import PrefillPacer


def test_the_first_step_is_small_until_a_step_was_measured() -> None:
    assert PrefillPacer(512).chunk_tokens(3) == 64
    assert PrefillPacer(48).chunk_tokens(1) == 48


def test_a_slow_machine_gets_chunks_that_fit_the_target() -> None:
    pacer = PrefillPacer(512, target_s=4.0)
    pacer.record([(1, 512, 4000), (2, 512, 4000)], seconds=62.0)  # the hang this exists for
    assert pacer.tokens_per_s == pytest.approx(1024 / 62)
    assert pacer.chunk_tokens(2) == 33  # 16.5 tok/s * 4 s / 2 prompts
    assert pacer.chunk_tokens(1) == 66


def test_a_fast_machine_keeps_the_configured_chunk_and_never_goes_below_the_floor() -> None:
    pacer = PrefillPacer(512, target_s=4.0)
    pacer.record([(1, 512, 4000)], seconds=0.1)
    assert pacer.chunk_tokens(8) == 512
    slow = PrefillPacer(512, target_s=4.0)
    slow.record([(1, 64, 4000)], seconds=600.0)
    assert slow.chunk_tokens(8) == slow.min_chunk == 32


def test_progress_counts_only_new_tokens_and_finished_prompts_are_forgotten() -> None:
    pacer = PrefillPacer(512)
    pacer.record([(1, 256, 1000)], seconds=1.0)
    pacer.record([(1, 512, 1000)], seconds=1.0)  # 256 new, not 512
    assert pacer.tokens_per_s == pytest.approx(256.0)
    pacer.record([(1, 1000, 1000)], seconds=1.0)
    assert pacer._done == {}
    pacer.record([(2, 10, 1000)], seconds=5.0)  # too few tokens to say anything
    assert pacer.tokens_per_s == pytest.approx(0.5 * 256 + 0.5 * 488)


@pytest.fixture(scope="module")
def tiny(default_model_dir: Path):
    return make_tiny("llama", default_model_dir)


def test_an_answer_prefilled_in_paced_chunks_equals_one_in_whole_chunks(tiny) -> None:
    messages = chat("Tell me about topic 7. " * 30)
    whole = Harness(tiny, cache=False, chunk=512)
    expected, _ = whole.ask(messages)
    paced = Harness(tiny, cache=False, chunk=512)
    paced.engine._pacer.target_s = 1e-6  # any machine is "slow": every chunk is the floor
    chunks: list[int] = []
    step = paced.engine._generator.next

    def recording():
        chunks.append(paced.engine._generator.prefill_step_size)
        return step()
    paced.engine._generator.next = recording
    tokens, finish = paced.ask(messages)
    assert tokens == expected and finish.usage.prompt_tokens > 512
    assert chunks[0] == 64 and min(chunks) == paced.engine._pacer.min_chunk
