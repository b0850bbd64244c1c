"""worker/batch_adapter.py reads private fields of mlx-lm's BatchGenerator. These tests do
those reads against the installed mlx-lm, without the adapter's fallback, and fail
naming the field when an mlx-lm upgrade moves or reshapes it."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.generate import BatchGenerator

from tests.worker.tiny_models import make_tiny
from worker.batch_adapter import (
    CHECKED_MLX_LM_VERSION,
    make_batch_generator,
    peek_sampled_token,
    sampled_logprobs,
    sampled_token,
)

PROMPT = list(range(100, 140))
CHANGED = (f"mlx-lm {version('mlx-lm')} changed BatchGenerator's internals (worker/batch_adapter.py was "
           f"written against {CHECKED_MLX_LM_VERSION}); update the adapter")


@pytest.fixture(scope="module")
def tiny(default_model_dir: Path):
    return make_tiny("llama", default_model_dir)


def at_end_of_prompt(tiny) -> tuple[BatchGenerator, int]:
    """A generator whose one sequence has just finished its prompt: its first token is
    sampled, and not reported yet."""
    generator = make_batch_generator(tiny.model, eos_token_ids=[], max_num_seqs=2, prefill_chunk_tokens=16)
    (uid,) = generator.insert_segments([[PROMPT]], max_tokens=[4])
    for _ in range(len(PROMPT)):
        prompt_responses, generation_responses = generator.next()
        assert not [r for r in generation_responses if r.uid == uid], "reported before its prompt ended"
        if any(r.uid == uid and r.end_of_prompt for r in prompt_responses):
            return generator, uid
    pytest.fail("the prompt never ended")


def test_the_private_fields_are_where_the_adapter_reads_them(tiny) -> None:
    generator, uid = at_end_of_prompt(tiny)
    assert hasattr(generator, "_generation_batch"), f"{CHANGED}: no BatchGenerator._generation_batch"
    batch = generator._generation_batch
    assert isinstance(getattr(batch, "uids", None), list), f"{CHANGED}: the generation batch has no list `uids`"
    assert uid in batch.uids, f"{CHANGED}: a sequence past its prompt is not in `_generation_batch.uids`"
    next_tokens = getattr(batch, "_next_tokens", None)
    assert isinstance(next_tokens, mx.array), f"{CHANGED}: no array `_generation_batch._next_tokens`"
    assert next_tokens.shape == (len(batch.uids),), f"{CHANGED}: `_next_tokens` is not one token per uid"


def test_the_token_read_early_is_the_token_reported_next(tiny) -> None:
    generator, uid = at_end_of_prompt(tiny)
    early = sampled_token(generator, uid)  # raises if the internals changed
    assert early is not None, f"{CHANGED}: no sampled token for a sequence past its prompt"
    _, generation_responses = generator.next()
    (reported,) = [r for r in generation_responses if r.uid == uid]
    assert reported.token == early, f"{CHANGED}: `_next_tokens` no longer holds the next reported token"


def test_the_distribution_read_early_is_the_one_reported_next(tiny) -> None:
    generator, uid = at_end_of_prompt(tiny)
    early = sampled_logprobs(generator, uid)  # raises if the internals changed
    assert early is not None, f"{CHANGED}: no `_next_logprobs` row for a sequence past its prompt"
    assert peek_sampled_token(generator, uid, with_logprobs=True)[1] is early
    _, generation_responses = generator.next()
    (reported,) = [r for r in generation_responses if r.uid == uid]
    assert mx.array_equal(reported.logprobs, early), f"{CHANGED}: `_next_logprobs` is not what the next step reports"


def test_what_is_not_decoding_has_no_early_token(tiny) -> None:
    generator = make_batch_generator(tiny.model, eos_token_ids=[], max_num_seqs=2, prefill_chunk_tokens=16)
    assert sampled_token(generator, 7) is None and sampled_logprobs(generator, 7) is None
    assert peek_sampled_token(object(), 7) is None  # internals gone: the feature turns off, nothing raises
