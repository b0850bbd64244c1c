"""Tiny random-weight mlx-lm models of several cache families, with the real tokenizer.

Fast stand-ins for cache-type coverage: a sliding-window model (RotatingKVCache), a
hybrid conv/attention model (ArraysCache + KVCache), and plain llama (KVCache).
"""

from __future__ import annotations

import importlib
from pathlib import Path
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
# (test_prefix_cache's shuffle check fails at 1.0 and passes here).
QUERY_KEY_SCALE = 6.0
VALUE_OUTPUT_SCALE = 4.0


def sharpen_attention(model: nn.Module) -> None:
    """Scale every attention projection (in place): q and k by QUERY_KEY_SCALE, v and o by
    VALUE_OUTPUT_SCALE."""
    scales = {"q_proj.weight": QUERY_KEY_SCALE, "k_proj.weight": QUERY_KEY_SCALE,
              "v_proj.weight": VALUE_OUTPUT_SCALE, "o_proj.weight": VALUE_OUTPUT_SCALE}
    scaled = [(name, value * scale) for name, value in tree_flatten(model.parameters())
              for part, scale in scales.items() if name.endswith(part)]
    model.load_weights(scaled, strict=False)


def make_tiny(arch: str, tokenizer_dir: Path, seed: int = 0) -> LoadedModel:
    """A random-weight model of `arch` (fp32), deterministic for a given seed."""
    config = ARCHS[arch]
    module = importlib.import_module(f"mlx_lm.models.{arch}")
    mx.random.seed(seed)
    model: nn.Module = module.Model(module.ModelArgs.from_dict(config))
    model.set_dtype(mx.float32)
    sharpen_attention(model)
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
