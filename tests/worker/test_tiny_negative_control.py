"""Negative controls for the tiny models (as test_cache_negative_control does on SmolLM2):
a hit equals scratch, and the same hit from a damaged cache does not, so the
cache-equality tests on llama (KVCache), gemma3_text (RotatingKVCache + KVCache) and lfm2
(ArraysCache conv state + KVCache) can fail. Counted over several prompts: the tiny
models must be sharp (tiny_models.SHARPENING) for what the cache holds to decide the
tokens."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from protocol.block_keys import BlockKey
from tests.worker.damaged_caches import LayerChange, answer_from_damaged_cache, negate_keys, reverse_keys, zero_state
from tests.worker.test_prefix_cache import BLOCK, chat
from tests.worker.tiny_models import ARCHS, make_tiny
from worker.model_loader import LoadedModel

# ten questions after the long system prompt (its blocks 0-8, shared)
QUESTIONS = (
    "What is topic 3?", "Tell me about topic 7, please.", "Summarise rules 1 to 4.",
    "Which rule mentions topic 12?", "How many rules are there?", "Explain topic 20 in one line.",
    "Is topic 5 related to topic 6?", "List three topics.", "What should I ask about topic 0?",
    "Repeat the last rule.",
)


def num_prompt_tokens(tiny: LoadedModel, messages: list[dict]) -> int:
    text = tiny.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return len(tiny.tokenizer.encode(text, add_special_tokens=False))


def ending_one_token_after_a_block(tiny: LoadedModel, user: str) -> list[dict]:
    """`user`'s chat, padded so the hit covers every prompt token but the last: that token
    gives the first logits and reads the restored snapshot state directly (a conv state
    holds only the last conv_L_cache - 1 tokens: its effect on a token many positions later
    goes through one attention layer only, and changed 6 of 10 answers when zeroed)."""
    for pad in range(2 * BLOCK):
        messages = chat(user + " ok" * pad)
        if num_prompt_tokens(tiny, messages) % BLOCK == 1:
            return messages
    raise AssertionError(f"no padding of {user!r} ends one token after a block")


def count_changed(tiny: LoadedModel, prompts: list[list[dict]], blocks: Callable[[list[BlockKey]], list[BlockKey]],
                  change: LayerChange, min_cached_tokens: Callable[[list[dict]], int]) -> int:
    """How many prompts' greedy tokens the damage changes; each prompt's undamaged hit
    must equal scratch, and its damaged hit must come from the cache."""
    changed = 0
    for messages in prompts:
        answers = answer_from_damaged_cache(tiny, messages, blocks, change)
        assert answers.hit == answers.scratch
        assert answers.cached_tokens >= min_cached_tokens(messages)
        changed += answers.damaged != answers.scratch
    return changed


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_a_reversed_cached_block_changes_the_greedy_tokens(arch: str, default_model_dir: Path) -> None:
    """Block 2's keys reversed in token order in every attention layer change the greedy
    tokens of at least 9 of the 10 prompts."""
    tiny = make_tiny(arch, default_model_dir)
    changed = count_changed(tiny, [chat(q) for q in QUESTIONS], lambda keys: [keys[2]], reverse_keys,
                            lambda _: 4 * BLOCK)
    assert changed >= 9, f"{arch}: a reversed block changed {changed} of {len(QUESTIONS)} answers"


@pytest.mark.parametrize("arch", ["gemma3_text", "lfm2"])
def test_a_negated_cached_block_changes_the_answer(arch: str, default_model_dir: Path) -> None:
    """Block 1's keys negated in every attention layer (gemma3_text's global one, lfm2's
    one) change every answer."""
    tiny = make_tiny(arch, default_model_dir)
    prompts = [chat(q) for q in QUESTIONS[:5]]
    changed = count_changed(tiny, prompts, lambda keys: [keys[1]], negate_keys, lambda _: 4 * BLOCK)
    assert changed == len(prompts), f"{arch}: a negated block changed {changed} of {len(prompts)} answers"


@pytest.mark.parametrize("arch", ["gemma3_text", "lfm2"])  # a rotating window, a conv state
def test_a_zeroed_snapshot_state_changes_the_answer(arch: str, default_model_dir: Path) -> None:
    """Every stored snapshot layer zeroed (lfm2's conv states, gemma3_text's rotating
    windows), K/V slices intact, as a restore that lost the state would give: every
    answer changes."""
    tiny = make_tiny(arch, default_model_dir)
    prompts = [ending_one_token_after_a_block(tiny, q) for q in QUESTIONS[:5]]
    changed = count_changed(tiny, prompts, lambda keys: keys, zero_state,
                            lambda messages: num_prompt_tokens(tiny, messages) - 1)
    assert changed == len(prompts), f"{arch}: a zeroed state changed {changed} of {len(prompts)} answers"
