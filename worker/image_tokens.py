"""Images in a prompt as token ids the prefix cache can key, and their embeddings.

A vision model's processor writes each image as a run of image tokens (the same id for
every image). The prefix cache keys blocks by token ids, so with that id an answer about
one picture would be served from the cache for another. Here each image token gets an id
of its own above the vocabulary, derived from the image's content hash and its position
in the image's run: the same image gives the same ids (the next turn hits), a different
image gives different ids (it never does). Ids are 31 bits (what the model's int32 input
holds); two different images giving the same run of ids would take a collision at every
one of their positions, and an id that collides with a live image's is moved (a cache miss,
never a wrong hit).

`ImageEmbedding` stands in for the text model's token embedding: ids below the vocabulary
are looked up as before, ids above it get their image's features, computed by the vision
tower on first use (in the engine's thread, like any forward pass) and kept in a small
LRU while requests prefill.
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

ID_LIMIT = 2**31 - 1
KEPT_IMAGES = 64  # images whose features stay computed (a request holds at most max_images of them)


@dataclass
class TableImage:
    """One image: its ids and how to compute its features (`encode`: () -> (n, dim))."""

    ids: list[int]
    encode: Callable[[], mx.array] | None  # dropped once used: it holds the image's pixels
    features: mx.array | None = None

    def __post_init__(self) -> None:
        self.positions = {token: k for k, token in enumerate(self.ids)}

    def computed(self) -> mx.array:
        if self.features is None:
            assert self.encode is not None
            self.features = self.encode()
            mx.eval(self.features)
            self.encode = None
        return self.features


class ImageTable:
    """Live images by id. Thread-safe enough for its use: the tokenizer thread adds images,
    the engine thread reads them (dict operations under the GIL)."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._by_id: dict[int, bytes] = {}
        self._images: collections.OrderedDict[bytes, TableImage] = collections.OrderedDict()

    def add(self, digest: bytes, num_tokens: int, encode: Callable[[], mx.array]) -> list[int]:
        """The ids of an image with content hash `digest` and `num_tokens` tokens."""
        known = self._images.get(digest)
        if known is not None and len(known.ids) == num_tokens:
            self._images.move_to_end(digest)
            return known.ids
        for attempt in range(16):
            ids = image_ids(digest, num_tokens, self.vocab_size, attempt)
            if all(self._by_id.get(i, digest) == digest for i in ids) and len(set(ids)) == len(ids):
                break
        else:
            raise RuntimeError("could not give this image ids of its own")
        self._images[digest] = TableImage(ids, encode)
        for i in ids:
            self._by_id[i] = digest
        while len(self._images) > KEPT_IMAGES:
            _, gone = self._images.popitem(last=False)
            for i in gone.ids:
                self._by_id.pop(i, None)
        return ids

    def rows(self, ids: np.ndarray) -> mx.array:
        """The features of image token ids, in order (computing an image's on first use)."""
        offsets: dict[bytes, int] = {}
        blocks: list[mx.array] = []
        flat = []
        for token in ids.tolist():
            digest = self._by_id.get(token)
            if digest is None:
                raise KeyError(f"image token {token} belongs to no live image")
            image = self._images[digest]
            if digest not in offsets:
                offsets[digest] = sum(block.shape[0] for block in blocks)
                blocks.append(image.computed())
            flat.append(offsets[digest] + image.positions[token])
        return mx.concatenate(blocks)[mx.array(flat)]

    def __len__(self) -> int:
        return len(self._images)


def image_ids(digest: bytes, num_tokens: int, vocab_size: int, attempt: int = 0) -> list[int]:
    """Token ids above `vocab_size` for each position of an image's run."""
    span = ID_LIMIT - vocab_size
    ids = []
    for k in range(num_tokens):
        h = hashlib.blake2b(digest + k.to_bytes(4, "little") + attempt.to_bytes(2, "little"), digest_size=8)
        ids.append(vocab_size + int.from_bytes(h.digest(), "little") % span)
    return ids


class ImageEmbedding(nn.Module):
    """The text model's token embedding, with image token ids looked up in `table`."""

    def __init__(self, base: nn.Module, table: ImageTable) -> None:
        super().__init__()
        self.base = base
        self._table = table

    def __call__(self, ids: mx.array) -> mx.array:
        if ids.shape[-1] == 1:  # a decode step: generated tokens are never images
            return self.base(ids)
        host = np.array(ids)
        images = host >= self._table.vocab_size
        if not images.any():
            return self.base(ids)
        h = self.base(mx.array(np.where(images, 0, host)))
        rows = self._table.rows(host[images]).astype(h.dtype)
        index = np.zeros(host.shape, dtype=np.int32)
        index[images] = np.arange(1, int(images.sum()) + 1)
        table = mx.concatenate([mx.zeros((1, h.shape[-1]), dtype=h.dtype), rows])
        return mx.where(mx.array(images)[..., None], table[mx.array(index)], h)

    def as_linear(self, x: mx.array) -> mx.array:
        """Tied output weights: the vocabulary's, as before (images are never predicted)."""
        return self.base.as_linear(x)


def content_digest(data: bytes) -> bytes:
    """The image's content hash: its identity for the cache."""
    return hashlib.sha256(data).digest()


def install(model: Any, table: ImageTable) -> None:
    """Put an `ImageEmbedding` in place of the text model's token embedding."""
    inner = model.language_model.model if hasattr(model, "language_model") else model.model
    inner.embed_tokens = ImageEmbedding(inner.embed_tokens, table)
