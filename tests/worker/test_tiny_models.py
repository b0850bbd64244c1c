"""The tiny models are sharpened on every architecture by their parameters' real names:
every layer's attention (and lfm2's short convolutions) is scaled, and a parameter that
mlx-lm renames fails loudly instead of leaving a model blunt. test_tiny_negative_control
measures that the result is sharp."""

from __future__ import annotations

import importlib

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten

from tests.worker.tiny_models import ARCHS, SHARPENING, sharpen_attention


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
