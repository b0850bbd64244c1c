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
    decode_step_uids,
    decoding_rows,
    make_batch_generator,
    peek_sampled_token,
    sampled_logprobs,
    sampled_token,
    take_processors,
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


def test_the_rows_a_step_feeds_are_what_its_processors_see(tiny) -> None:
    """`decoding_rows`, read inside a processor of the running batch's step, names that
    processor in its row and the token its context just grew by (worker/grammar_batch.py
    relies on both)."""
    generator = make_batch_generator(tiny.model, eos_token_ids=[], max_num_seqs=4, prefill_chunk_tokens=16)
    seen: list[tuple[bool, int, int]] = []

    def recording(context: mx.array, logits: mx.array) -> mx.array:
        rows = decoding_rows(generator)
        assert rows is not None, f"{CHANGED}: no `logits_processors`/`_current_tokens` on the generation batch"
        processors, tokens = rows
        found = [e for e, procs in enumerate(processors) if recording in (procs or ())]
        # a sequence's first step runs in a batch of its own, before it joins the running one
        seen.append((bool(found), int(tokens[found[0]].item()) if found else -1, int(context[-1].item())))
        return logits

    generator.insert_segments([[PROMPT]], max_tokens=[6], logits_processors=[[recording]])
    generator.insert_segments([[PROMPT[:20]]], max_tokens=[6])  # a free row beside it
    for _ in range(40):
        generator.next()
    assert not seen[0][0]
    in_batch = seen[1:]
    assert len(in_batch) >= 3 and all(found for found, _, _ in in_batch), f"{CHANGED}: a decoding row is missing"

    assert all(fed == grew for _, fed, grew in in_batch), f"{CHANGED}: `_current_tokens` is not what the step feeds"


def test_a_processor_taken_from_its_row_is_no_longer_called(tiny) -> None:
    """`take_processors` removes only what it selects from the running batch's rows and
    mlx-lm stops calling it; `decode_step_uids` names the rows only in the running
    batch's decode call, never in a prefill chunk or a new sequence's first step
    (worker/grammar_batch.py masks the taken grammars' rows through both)."""
    calls = {"taken": 0, "kept": 0}

    def taken(context: mx.array, logits: mx.array) -> mx.array:
        calls["taken"] += 1
        return logits

    def kept(context: mx.array, logits: mx.array) -> mx.array:
        calls["kept"] += 1
        return logits

    seen: list[tuple[int, list[int] | None]] = []

    class Recording:  # the model as the generator calls it
        def __call__(self, inputs: mx.array, cache: object = None) -> mx.array:
            seen.append((inputs.shape[1], decode_step_uids(generator, cache)))
            return tiny.model(inputs, cache=cache)

        def __getattr__(self, name: str) -> object:
            return getattr(tiny.model, name)

    generator = make_batch_generator(Recording(), eos_token_ids=[], max_num_seqs=2, prefill_chunk_tokens=16)
    (uid,) = generator.insert_segments([[PROMPT]], max_tokens=[30], logits_processors=[[taken, kept]])
    while not calls["taken"]:
        generator.next()
    first_steps = len(seen)
    generator.next()  # the first step of the running batch, with both processors
    assert take_processors(generator, lambda p: p is taken) == [(uid, taken)], f"{CHANGED}: no processor taken"
    before = dict(calls)
    for _ in range(3):
        generator.next()
    assert calls == {"taken": before["taken"], "kept": before["kept"] + 3}, f"{CHANGED}: processors moved"
    assert all(uids is None for _, uids in seen[:first_steps]), "a prefill or first step taken for a decode step"
    assert seen[first_steps:] and all(uids == [uid] and width == 1 for width, uids in seen[first_steps:]), (
        f"{CHANGED}: the decode step's cache is not `_generation_batch.prompt_cache`")
