"""Tiny random-weight mlx-lm models of several cache families, with the real tokenizer.

Fast stand-ins for cache-type coverage: a sliding-window model (RotatingKVCache), a
hybrid conv/attention model (ArraysCache + KVCache), and plain llama (KVCache).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.utils import load_tokenizer

from worker.model_loader import LoadedModel

VOCAB = 49152  # SmolLM2's tokenizer

ARCHS: dict[str, dict[str, Any]] = {
    "llama": dict(
        model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=VOCAB,
        tie_word_embeddings=True, max_position_embeddings=4096,
    ),
    "gemma3_text": dict(
        model_type="gemma3_text", hidden_size=64, num_hidden_layers=3, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=1, head_dim=16, vocab_size=VOCAB,
        sliding_window=64, sliding_window_pattern=2, query_pre_attn_scalar=16,
        max_position_embeddings=4096,
    ),
    "lfm2": dict(
        model_type="lfm2", vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        norm_eps=1e-5, conv_bias=False, conv_L_cache=3, block_dim=64, block_multiple_of=16,
        block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=False, intermediate_size=128,
        full_attn_idxs=[1],
    ),
}


# mlx-lm's random init makes a tiny model nearly a bigram model: q and k give every
# attention score ~0 (uniform attention), and v and o make attention's output small next
# to the token's own embedding, so a wrong or misplaced cached block hardly moves a token.
# Scaled by these, attention is sharp and what it reads decides the answer
# (test_tiny_negative_control: a reversed cached block changes the greedy tokens of >= 9 of 10
# prompts on every architecture).
QUERY_KEY_SCALE = 6.0
VALUE_OUTPUT_SCALE = 4.0
# lfm2's short convolutions read the last conv_L_cache - 1 tokens from their state; at
# random init their output is small next to the residual (a zeroed state restored 10+
# tokens before the prompt's end changed 3 of 10 answers; 6 of 10 scaled by this)
CONV_SCALE = 4.0

Rescale = Callable[[mx.array], mx.array]


def _times(scale: float) -> Rescale:
    return lambda weight: weight * scale


def _gain_times(scale: float) -> Rescale:
    """Gemma's RMSNorm multiplies by 1 + weight: scale that gain, not the weight."""
    return lambda weight: (1.0 + weight) * scale - 1.0


# Per architecture: a decoder layer's mixer (the attribute it holds it under) -> the
# parameters under the layer that make it sharp. Llama's q and k feed the scores as they
# are; gemma3_text and lfm2 normalise q and k per head first, so scaling q_proj/k_proj
# cancels and the norms' gains must be scaled instead. Gemma normalises the attention's
# output too (post_attention_layernorm), which cancels v/o and leaves that norm's gain.
SHARPENING: dict[str, dict[str, dict[str, Rescale]]] = {
    "llama": {"self_attn": {
        "self_attn.q_proj.weight": _times(QUERY_KEY_SCALE), "self_attn.k_proj.weight": _times(QUERY_KEY_SCALE),
        "self_attn.v_proj.weight": _times(VALUE_OUTPUT_SCALE), "self_attn.o_proj.weight": _times(VALUE_OUTPUT_SCALE),
    }},
    "gemma3_text": {"self_attn": {
        "self_attn.q_norm.weight": _gain_times(QUERY_KEY_SCALE), "self_attn.k_norm.weight": _gain_times(QUERY_KEY_SCALE),
        "post_attention_layernorm.weight": _gain_times(VALUE_OUTPUT_SCALE),
    }},
    "lfm2": {
        "self_attn": {
            "self_attn.q_layernorm.weight": _times(QUERY_KEY_SCALE), "self_attn.k_layernorm.weight": _times(QUERY_KEY_SCALE),
            "self_attn.v_proj.weight": _times(VALUE_OUTPUT_SCALE), "self_attn.out_proj.weight": _times(VALUE_OUTPUT_SCALE),
        },
        "conv": {"conv.conv.weight": _times(CONV_SCALE), "conv.out_proj.weight": _times(CONV_SCALE)},
    },
}


def sharpen_attention(model: nn.Module, arch: str) -> dict[str, int]:
    """Scale (in place) every layer's mixer parameters listed for `arch` in SHARPENING;
    returns how many layers of each mixer were scaled.

    Every layer must hold one of the listed mixers with every listed parameter, and at
    least one layer must be attention: a parameter renamed by mlx-lm fails here instead of
    leaving the model silently blunt."""
    spec = SHARPENING[arch]
    counts = dict.fromkeys(spec, 0)
    for index, layer in enumerate(model.layers):
        mixers = [name for name in spec if name in layer]
        if len(mixers) != 1:
            raise AssertionError(f"{arch} layer {index} holds {sorted(layer)}: expected one of {sorted(spec)}")
        params = dict(tree_flatten(layer.parameters()))
        missing = sorted(set(spec[mixers[0]]) - set(params))
        if missing:
            raise AssertionError(f"{arch} layer {index} has no {missing}: the model would stay blunt")
        layer.load_weights([(name, rescale(params[name])) for name, rescale in spec[mixers[0]].items()], strict=False)
        counts[mixers[0]] += 1
    if not counts.get("self_attn"):
        raise AssertionError(f"{arch} has no attention layer to sharpen")
    return counts


def make_tiny(arch: str, tokenizer_dir: Path, seed: int = 0, vocab_size: int | None = None) -> LoadedModel:
    """A random-weight model of `arch` (fp32), deterministic for a given seed; `vocab_size`
    for a tokenizer other than SmolLM2's."""
    config = ARCHS[arch] if vocab_size is None else {**ARCHS[arch], "vocab_size": vocab_size}
    module = importlib.import_module(f"mlx_lm.models.{arch}")
    mx.random.seed(seed)
    model: nn.Module = module.Model(module.ModelArgs.from_dict(config))
    model.set_dtype(mx.float32)
    sharpen_attention(model, arch)
    mx.eval(model.parameters())
    weights_bytes = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    return LoadedModel(
        model=model,
        tokenizer=load_tokenizer(tokenizer_dir),
        config=config,
        dtype="float32",
        device="cpu",
        context_length=config["max_position_embeddings"],
        weights_bytes=weights_bytes,
        load_time_s=0.0,
        fingerprint=f"tiny-{arch}-{seed}".encode(),
    )
