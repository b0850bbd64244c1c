"""BERT-family encoders in MLX: the forward pass of a sentence encoder (BertModel,
RoBERTa's variant of it) and of a cross-encoder (the same with a pooler and a
classification head), with HF checkpoint names mapped onto it.

Padding is masked out of attention as keys, so a padded row of a batch computes what it
computes alone: a batch of mixed lengths gives each sequence its own result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from worker.cpu_kernels import encoder_ops

# model types whose position ids start after the padding index (fairseq's convention)
OFFSET_POSITIONS = {"roberta", "xlm-roberta", "camembert"}


@dataclass(frozen=True)
class BertArgs:
    """The config.json fields the forward pass reads (HF's names)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    pad_token_id: int = 0
    model_type: str = "bert"
    num_labels: int = 0  # a classification head's outputs (a cross-encoder); 0: none

    @classmethod
    def from_config(cls, config: dict[str, Any], with_classifier: bool = False) -> BertArgs:
        num_labels = 0
        if with_classifier:
            num_labels = int(config.get("num_labels") or len(config.get("id2label") or {}) or 1)
        return cls(
            vocab_size=config["vocab_size"], hidden_size=config["hidden_size"],
            num_hidden_layers=config["num_hidden_layers"], num_attention_heads=config["num_attention_heads"],
            intermediate_size=config["intermediate_size"], max_position_embeddings=config["max_position_embeddings"],
            type_vocab_size=config.get("type_vocab_size", 2), layer_norm_eps=config.get("layer_norm_eps", 1e-12),
            hidden_act=config.get("hidden_act", "gelu"), pad_token_id=config.get("pad_token_id") or 0,
            model_type=config.get("model_type", "bert"), num_labels=num_labels,
        )

    @property
    def position_offset(self) -> int:
        return self.pad_token_id + 1 if self.model_type in OFFSET_POSITIONS else 0

    @property
    def max_tokens(self) -> int:
        """Longest sequence the position table holds."""
        return self.max_position_embeddings - self.position_offset


def _activation(name: str) -> Any:
    if name in ("gelu", "gelu_python"):
        return encoder_ops()[0] or nn.gelu  # the erf form, as HF's "gelu"
    if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        return nn.gelu_approx
    if name == "relu":
        return nn.relu
    raise ValueError(f"unsupported hidden_act {name!r} in config.json")


def _mlx_attention(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: mx.array) -> mx.array:
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)


class Embeddings(nn.Module):
    def __init__(self, args: BertArgs) -> None:
        super().__init__()
        self.offset = args.position_offset
        self.word_embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
        self.position_embeddings = nn.Embedding(args.max_position_embeddings, args.hidden_size)
        self.token_type_embeddings = nn.Embedding(args.type_vocab_size, args.hidden_size)
        self.norm = nn.LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

    def __call__(self, ids: mx.array, token_types: mx.array) -> mx.array:
        positions = mx.arange(ids.shape[1]) + self.offset
        h = self.word_embeddings(ids) + self.position_embeddings(positions)[None] + self.token_type_embeddings(token_types)
        return self.norm(h)


class Layer(nn.Module):
    """One post-norm transformer layer: attention, add & norm, feed-forward, add & norm."""

    def __init__(self, args: BertArgs) -> None:
        super().__init__()
        h, eps = args.hidden_size, args.layer_norm_eps
        self.num_heads = args.num_attention_heads
        self.scale = 1.0 / math.sqrt(h // self.num_heads)
        self.query = nn.Linear(h, h)
        self.key = nn.Linear(h, h)
        self.value = nn.Linear(h, h)
        self.attention_out = nn.Linear(h, h)
        self.attention_norm = nn.LayerNorm(h, eps=eps)
        self.intermediate = nn.Linear(h, args.intermediate_size)
        self.output = nn.Linear(args.intermediate_size, h)
        self.output_norm = nn.LayerNorm(h, eps=eps)
        self.act = _activation(args.hidden_act)
        self.attend = encoder_ops()[1] or _mlx_attention

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        batch, length, hidden = x.shape

        def heads(t: mx.array) -> mx.array:
            return t.reshape(batch, length, self.num_heads, -1).transpose(0, 2, 1, 3)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        attended = self.attend(q, k, v, self.scale, mask)
        attended = attended.transpose(0, 2, 1, 3).reshape(batch, length, hidden)
        x = self.attention_norm(x + self.attention_out(attended))
        return self.output_norm(x + self.output(self.act(self.intermediate(x))))


class Bert(nn.Module):
    """The encoder; with `args.num_labels`, also the pooler and classification head of a
    cross-encoder (`classify`)."""

    def __init__(self, args: BertArgs) -> None:
        super().__init__()
        self.args = args
        self.embeddings = Embeddings(args)
        self.layers = [Layer(args) for _ in range(args.num_hidden_layers)]
        if args.num_labels:
            self.pooler = nn.Linear(args.hidden_size, args.hidden_size)
            self.classifier = nn.Linear(args.hidden_size, args.num_labels)

    def __call__(self, ids: mx.array, attention_mask: mx.array, token_types: mx.array | None = None) -> mx.array:
        """Hidden states (batch, length, hidden) of right- or left-padded `ids`;
        `attention_mask` is 1 for real tokens, 0 for padding."""
        if token_types is None:
            token_types = mx.zeros_like(ids)
        x = self.embeddings(ids, token_types)
        # additive mask over keys: padding gets -inf-like weight in every row
        mask = ((1 - attention_mask.astype(x.dtype)) * mx.finfo(x.dtype).min)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, mask)
        return x

    def classify(self, hidden: mx.array) -> mx.array:
        """Logits (batch, num_labels) from the first token's hidden state, as HF's
        BertForSequenceClassification (dropout is off at inference)."""
        return self.classifier(mx.tanh(self.pooler(hidden[:, 0])))


_RENAMES = (
    ("embeddings.LayerNorm.", "embeddings.norm."),
    ("attention.self.query.", "query."),
    ("attention.self.key.", "key."),
    ("attention.self.value.", "value."),
    ("attention.output.dense.", "attention_out."),
    ("attention.output.LayerNorm.", "attention_norm."),
    ("intermediate.dense.", "intermediate."),
    ("output.dense.", "output."),
    ("output.LayerNorm.", "output_norm."),
    ("pooler.dense.", "pooler."),
    ("encoder.layer.", "layers."),
)
_PREFIXES = ("bert.", "roberta.", "model.")


def checkpoint_names(weights: dict[str, mx.array], with_classifier: bool) -> dict[str, mx.array]:
    """HF checkpoint names -> this module's: the model prefix of a *ForSequenceClassification
    checkpoint dropped, buffers (position_ids) and unused heads (a masked-LM head, the
    pooler of a sentence encoder) left out. Old checkpoints' LayerNorm gamma/beta too."""
    renamed = {}
    for name, value in weights.items():
        for prefix in _PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix):]
        name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        if name.endswith("position_ids") or name.startswith(("cls.", "lm_head.")):
            continue
        if name.startswith(("pooler.", "classifier.")) and not with_classifier:
            continue
        for old, new in _RENAMES:
            name = name.replace(old, new)
        if name.startswith("classifier.out_proj."):  # RoBERTa's head: dense + out_proj
            name = name.replace("classifier.out_proj.", "classifier.")
        elif name.startswith("classifier.dense."):
            name = name.replace("classifier.dense.", "pooler.")
        renamed[name] = value
    return renamed
