"""The tiny models are sharp on every architecture: each layer's attention (and lfm2's
short convolutions) is scaled by its parameters' real names, and what a cached block
holds decides the greedy tokens. Without this, the cache-equality tests on these models
pass whether or not the cache is right."""

from __future__ import annotations

import importlib
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten

from tests.worker.damaged_caches import answer_from_damaged_cache, reverse_keys
from tests.worker.test_prefix_cache import BLOCK, chat
from tests.worker.tiny_models import ARCHS, SHARPENING, make_tiny, sharpen_attention

# ten prompts sharing the long system prompt (its blocks 0-8), each its own question
QUESTIONS = [chat(q) for q in (
    "What is topic 3?", "Tell me about topic 7, please.", "Summarise rules 1 to 4.",
    "Which rule mentions topic 12?", "How many rules are there?", "Explain topic 20 in one line.",
    "Is topic 5 related to topic 6?", "List three topics.", "What should I ask about topic 0?",
    "Repeat the last rule.",
)]
REQUIRED_CHANGES = 9  # of len(QUESTIONS)


def _blunt(arch: str) -> nn.Module:
    """The model make_tiny builds for `arch`, before sharpening."""
    module = importlib.import_module(f"mlx_lm.models.{arch}")
    mx.random.seed(0)
    model = module.Model(module.ModelArgs.from_dict(ARCHS[arch]))
    model.set_dtype(mx.float32)
    return model


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_every_layer_is_sharpened_by_its_real_parameter_names(arch: str) -> None:
    model = _blunt(arch)
    before = dict(tree_flatten(model.parameters()))
    counts = sharpen_attention(model, arch)
    after = dict(tree_flatten(model.parameters()))
    attention = sum("self_attn" in layer for layer in model.layers)
    assert counts["self_attn"] == attention > 0
    assert sum(counts.values()) == len(model.layers)
    changed = {name for name in before if not mx.array_equal(before[name], after[name])}
    expected = {f"layers.{i}.{name}" for i, layer in enumerate(model.layers)
                for mixer, names in SHARPENING[arch].items() if mixer in layer for name in names}
    assert changed == {f"model.{name}" for name in expected}  # and nothing else


@pytest.mark.parametrize(("arch", "name"), [("lfm2", "out_proj"), ("gemma3_text", "q_norm"), ("llama", "o_proj")])
def test_a_renamed_parameter_fails_loudly(arch: str, name: str) -> None:
    model = _blunt(arch)
    attention = next(layer.self_attn for layer in model.layers if "self_attn" in layer)
    attention[name + "_renamed"] = attention.pop(name)  # as if mlx-lm renamed it
    with pytest.raises(AssertionError, match=name):
        sharpen_attention(model, arch)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_a_reversed_cached_block_changes_the_greedy_tokens(arch: str, default_model_dir: Path) -> None:
    """Block 2's keys reversed in token order in every attention layer: the hit from the
    cache as stored equals scratch, the hit from the reversed block does not, for at least
    9 of 10 prompts."""
    tiny = make_tiny(arch, default_model_dir)
    changed = 0
    for question in QUESTIONS:
        answers = answer_from_damaged_cache(tiny, question, lambda keys: [keys[2]], reverse_keys)
        assert answers.cached_tokens >= 4 * BLOCK  # served from the cache, past block 2
        assert answers.hit == answers.scratch
        changed += answers.damaged != answers.scratch
    assert changed >= REQUIRED_CHANGES, f"{arch}: a reversed block changed {changed} of {len(QUESTIONS)} answers"
