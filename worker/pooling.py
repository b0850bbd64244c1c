"""How a sentence encoder turns per-token hidden states into one vector: the pooling mode
and normalisation its sentence-transformers files ask for (modules.json, the Pooling
module's config.json), and the pooling itself over a padded batch."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx

POOLING_TYPE = "sentence_transformers.models.Pooling"
NORMALIZE_TYPE = "sentence_transformers.models.Normalize"
# sentence-transformers' flag for each mode, in the order it is checked here
_MODE_FLAGS = (("cls", "pooling_mode_cls_token"), ("last", "pooling_mode_lasttoken"),
               ("mean", "pooling_mode_mean_tokens"), ("max", "pooling_mode_max_tokens"))


@dataclass(frozen=True)
class Pooling:
    """`mode`: cls | mean | max | last (the last real token: decoder LLM embeddings);
    `normalize`: L2-normalise the pooled vector (cosine = dot product)."""

    mode: str
    normalize: bool


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_pooling(model_dir: Path, default_mode: str) -> Pooling:
    """The model's own pooling, from its sentence-transformers files. Without them:
    `default_mode` (mean for a BERT encoder, last for a decoder LLM), normalised, which
    is how such models are published to be used."""
    modules = _read_json(model_dir / "modules.json")
    if not isinstance(modules, list):
        return Pooling(default_mode, True)
    mode = default_mode
    for module in modules:
        if isinstance(module, dict) and module.get("type") == POOLING_TYPE:
            config = _read_json(model_dir / str(module.get("path", "")) / "config.json") or {}
            mode = next((name for name, flag in _MODE_FLAGS if config.get(flag)), default_mode)
    normalize = any(isinstance(m, dict) and m.get("type") == NORMALIZE_TYPE for m in modules)
    return Pooling(mode, normalize)


def read_max_tokens(model_dir: Path, model_limit: int) -> int:
    """The window inputs must fit: sentence-transformers' max_seq_length (what the model
    was trained to read), at most the model's position table."""
    config = _read_json(model_dir / "sentence_bert_config.json") or {}
    limit = config.get("max_seq_length") if isinstance(config, dict) else None
    return min(int(limit), model_limit) if isinstance(limit, int) and limit > 0 else model_limit


def pool(hidden: mx.array, mask: mx.array, lengths: mx.array, pooling: Pooling) -> mx.array:
    """(batch, hidden) vectors from right-padded `hidden` (batch, length, hidden); `mask`
    is 1 on real tokens, `lengths` the real tokens per row."""
    weights = mask.astype(hidden.dtype)[:, :, None]
    if pooling.mode == "cls":
        pooled = hidden[:, 0]
    elif pooling.mode == "last":
        pooled = mx.take_along_axis(hidden, (lengths - 1)[:, None, None], axis=1)[:, 0]
    elif pooling.mode == "max":
        pooled = mx.where(weights > 0, hidden, mx.finfo(hidden.dtype).min).max(axis=1)
    else:
        pooled = (hidden * weights).sum(axis=1) / mx.maximum(weights.sum(axis=1), 1e-9)
    if pooling.normalize:
        pooled = pooled / mx.maximum(mx.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
    return pooled
