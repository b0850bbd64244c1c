"""Negative controls for the tiny models whose caches are not plain K/V (as
test_cache_negative_control does on SmolLM2): a hit equals scratch, and the same hit from
a damaged cache does not, so the cache-equality tests on gemma3_text (RotatingKVCache +
KVCache) and lfm2 (ArraysCache conv state + KVCache) can fail."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.worker.damaged_caches import answer_from_damaged_cache, negate_keys, zero_state
from tests.worker.test_prefix_cache import BLOCK, chat
from tests.worker.test_tiny_models_sharp import QUESTIONS, REQUIRED_CHANGES
from tests.worker.tiny_models import make_tiny
from worker.model_loader import LoadedModel


@pytest.mark.parametrize("arch", ["gemma3_text", "lfm2"])
def test_a_negated_cached_block_changes_the_answer(arch: str, default_model_dir: Path) -> None:
    """Block 1's keys negated in every attention layer (gemma3_text's global layer, lfm2's
    attention layer)."""
    tiny = make_tiny(arch, default_model_dir)
    changed = 0
    for question in QUESTIONS:
        answers = answer_from_damaged_cache(tiny, question, lambda keys: [keys[1]], negate_keys)
        assert answers.cached_tokens >= 4 * BLOCK
        assert answers.hit == answers.scratch
        changed += answers.damaged != answers.scratch
    assert changed >= REQUIRED_CHANGES, f"{arch}: a negated block changed {changed} of {len(QUESTIONS)} answers"


def ending_one_token_after_a_block(tiny: LoadedModel, user: str) -> list[dict]:
    """`user`'s chat, padded so the hit covers every prompt token but the last: that token
    gives the first logits and reads the restored snapshot state directly (a conv state
    holds only the last conv_L_cache - 1 tokens, so its effect on a token many positions
    later goes through one attention layer only)."""
    for pad in range(2 * BLOCK):
        messages = chat(user + " ok" * pad)
        if num_prompt_tokens(tiny, messages) % BLOCK == 1:
            return messages
    raise AssertionError(f"no padding of {user!r} ends one token after a block")


def num_prompt_tokens(tiny: LoadedModel, messages: list[dict]) -> int:
    text = tiny.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return len(tiny.tokenizer.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("arch", ["gemma3_text", "lfm2"])  # a rotating window, a conv state
def test_a_zeroed_snapshot_state_changes_the_answer(arch: str, default_model_dir: Path) -> None:
    """Every stored snapshot layer zeroed (lfm2's conv states, gemma3_text's rotating
    windows), K/V slices intact: what a restore that lost the state would give."""
    tiny = make_tiny(arch, default_model_dir)
    changed = 0
    for question in QUESTIONS:
        messages = ending_one_token_after_a_block(tiny, question[-1]["content"])
        answers = answer_from_damaged_cache(tiny, messages, lambda keys: keys, zero_state)
        assert answers.cached_tokens == num_prompt_tokens(tiny, messages) - 1 >= 4 * BLOCK
        assert answers.hit == answers.scratch
        changed += answers.damaged != answers.scratch
    assert changed >= REQUIRED_CHANGES, f"{arch}: a zeroed state changed {changed} of {len(QUESTIONS)} answers"
