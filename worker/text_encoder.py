"""An embedding or reranker model loaded for serving: its tokenizer, its forward pass (a
BERT-family encoder, or a decoder LLM whose sentence-transformers config pools the last
token) and its pooling, behind three calls: tokenize, embed, score pairs."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from tokenizers import Tokenizer

from worker.bert import Bert, BertArgs, checkpoint_names
from worker.pooling import Pooling, pool, read_max_tokens, read_pooling

log = logging.getLogger(__name__)

BERT_TYPES = {"bert", "roberta", "xlm-roberta", "camembert", "distilbert"}
PAD_MULTIPLE = 8  # a batch is padded to a multiple of this: fewer distinct shapes, little waste


def pad_length(length: int, limit: int) -> int:
    """`length` rounded up to PAD_MULTIPLE, never past `limit`."""
    return min(-(-length // PAD_MULTIPLE) * PAD_MULTIPLE, max(limit, length))


class TextEncoder:
    """Token ids in, one vector (or one relevance score) per sequence out.

    `kind` "embedding" pools hidden states into unit vectors; "reranker" is a
    cross-encoder scoring (query, document) pairs through its classification head.
    Every call runs on whole right-padded batches; padding never changes a row's result
    beyond float rounding (it is masked, or, in a causal decoder, never attended to).
    """

    def __init__(self, model_dir: Path, kind: str) -> None:
        started = time.monotonic()
        self.model_dir = Path(model_dir)
        self.kind = kind
        self.config: dict[str, Any] = json.loads((self.model_dir / "config.json").read_text())
        self.is_bert = self.config.get("model_type") in BERT_TYPES
        self.tokenizer = Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
        self.tokenizer.no_truncation()  # too long is the caller's decision: refuse or truncate
        self.tokenizer.no_padding()
        if self.is_bert:
            self.model, model_limit = self._load_bert()
        else:
            if kind == "reranker":
                raise ValueError(f"a {self.config.get('model_type')} reranker is not supported (BERT-family only)")
            self.model, model_limit = self._load_decoder()
        self.pooling: Pooling = read_pooling(self.model_dir, "mean" if self.is_bert else "last")
        self.max_tokens = read_max_tokens(self.model_dir, model_limit)
        self.vocab_size = int(self.config.get("vocab_size") or self.tokenizer.get_vocab_size())
        self.dimensions = int(self.config["hidden_size"])
        self.prefix, self.suffix = self._special_tokens()
        self.load_time_s = time.monotonic() - started

    # ---------------------------------------------------------------- loading

    def _load_bert(self) -> tuple[Bert, int]:
        with_classifier = self.kind == "reranker"
        args = BertArgs.from_config(self.config, with_classifier)
        model = Bert(args)
        weights: dict[str, mx.array] = {}
        for file in sorted(self.model_dir.glob("*.safetensors")):
            weights.update(mx.load(str(file)))
        weights = {name: value.astype(mx.float32) for name, value in checkpoint_names(weights, with_classifier).items()}
        model.load_weights(list(weights.items()), strict=True)
        model.eval()
        mx.eval(model.parameters())
        return model, args.max_tokens

    def _load_decoder(self) -> tuple[Any, int]:
        from mlx_lm.utils import load as mlx_lm_load

        from worker.cpu_kernels import pack_quantized_panels

        model, _ = mlx_lm_load(str(self.model_dir))
        # a quantized decoder's weights go into the kernels' panels, as a chat model's do:
        # in MLX's own layout the kernels (installed process-wide) run their scalar loop
        pack_quantized_panels(model)
        limit = int(self.config.get("max_position_embeddings") or self.config.get("max_seq_len") or 8192)
        return model, limit

    def _special_tokens(self) -> tuple[list[int], list[int]]:
        """The ids the tokenizer puts before and after a text ([CLS] .. [SEP] for BERT),
        so token-id inputs get the same framing as text."""
        inner = self.tokenizer.encode("a", add_special_tokens=False).ids
        framed = self.tokenizer.encode("a").ids
        for start in range(len(framed) - len(inner) + 1):
            if framed[start:start + len(inner)] == inner:
                return framed[:start], framed[start + len(inner):]
        return [], []

    @property
    def weights_bytes(self) -> int:
        from mlx.utils import tree_flatten

        return sum(v.nbytes for _, v in tree_flatten(self.model.parameters()))

    # ---------------------------------------------------------------- tokens

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Each text's ids, special tokens included, not truncated."""
        return [encoding.ids for encoding in self.tokenizer.encode_batch(texts)]

    def frame(self, ids: list[int]) -> list[int]:
        """Token ids a client sent, framed as the tokenizer frames a text."""
        return [*self.prefix, *ids, *self.suffix]

    def truncate(self, ids: list[int]) -> list[int]:
        """`ids` cut to the window, the closing special tokens kept."""
        if len(ids) <= self.max_tokens:
            return ids
        keep = self.max_tokens - len(self.suffix)
        return ids[:keep] + ids[len(ids) - len(self.suffix):] if self.suffix else ids[:keep]

    def pair(self, query: str, document: str) -> tuple[list[int], list[int]]:
        """A cross-encoder's input: ([CLS] query [SEP] document [SEP], segment ids)."""
        encoding = self.tokenizer.encode(query, document)
        return encoding.ids, encoding.type_ids

    # ---------------------------------------------------------------- forward

    def _padded(self, rows: list[list[int]]) -> tuple[mx.array, mx.array, mx.array]:
        length = pad_length(max(len(r) for r in rows), self.max_tokens)
        pad = int(self.config.get("pad_token_id") or 0)
        ids = np.full((len(rows), length), pad, dtype=np.int32)
        mask = np.zeros((len(rows), length), dtype=np.int32)
        for i, row in enumerate(rows):
            ids[i, :len(row)] = row
            mask[i, :len(row)] = 1
        return mx.array(ids), mx.array(mask), mx.array(np.array([len(r) for r in rows], dtype=np.int32))

    def embed(self, rows: list[list[int]]) -> np.ndarray:
        """(len(rows), dimensions) float32 vectors, pooled as the model's config says."""
        ids, mask, lengths = self._padded(rows)
        if self.is_bert:
            hidden = self.model(ids, mask)
        else:
            hidden = self.model.model(ids)  # causal: a row never attends to its right padding
        vectors = pool(hidden.astype(mx.float32), mask, lengths, self.pooling)
        mx.eval(vectors)
        return np.array(vectors, dtype=np.float32)

    def score(self, pairs: list[tuple[list[int], list[int]]]) -> np.ndarray:
        """A cross-encoder's relevance of each (ids, segment ids) pair, in [0, 1]: the
        sigmoid of its one logit (sentence-transformers' CrossEncoder default), or the
        probability of the last label for a two-label head."""
        ids, mask, _ = self._padded([p[0] for p in pairs])
        types = np.zeros(ids.shape, dtype=np.int32)
        for i, (_, segment) in enumerate(pairs):
            types[i, :len(segment)] = segment
        logits = self.model.classify(self.model(ids, mask, mx.array(types)))
        if logits.shape[-1] == 1:
            scores = mx.sigmoid(logits[:, 0])
        else:
            scores = mx.softmax(logits, axis=-1)[:, -1]
        mx.eval(scores)
        return np.array(scores, dtype=np.float32)
