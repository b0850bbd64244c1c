"""The messages of embedding and reranker workers: a request names its inputs, the answer
carries vectors (as one extra frame of float32, never inside msgpack) or scores."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from protocol.message_base import Message

# a field with this metadata travels as an extra ZMQ frame (protocol.codec), not in the body
FRAME = "frame"


@dataclass
class EmbedRequest(Message):
    """Router -> embedding worker: one vector per input. An input is a text or token ids
    (framed by the worker with the special tokens a text gets). `truncate`: cut inputs
    longer than the model's window instead of refusing them. `dimensions`: keep the first
    this many components and renormalise (None: all)."""

    type: ClassVar[str] = "embed_request"
    request_id: str
    inputs: list[str | list[int]]
    truncate: bool = False
    dimensions: int | None = None


@dataclass
class EmbeddingsEvent(Message):
    """Embedding worker -> router: the answer to an EmbedRequest, the last event for its id.
    `vectors` is num_inputs x dimensions float32, little-endian, row-major."""

    type: ClassVar[str] = "embeddings"
    request_id: str
    num_inputs: int
    dimensions: int
    prompt_tokens: int
    vectors: bytes = field(default=b"", metadata={FRAME: True})


@dataclass
class RerankRequest(Message):
    """Router -> embedding or reranker worker: how relevant is each document to `query`?"""

    type: ClassVar[str] = "rerank_request"
    request_id: str
    query: str
    documents: list[str]
    truncate: bool = False


@dataclass
class RerankEvent(Message):
    """Worker -> router: one score per document, in the documents' order; the last event
    for its id. `method`: "cross-encoder" (a classification head read the pair) or "cosine"
    (the embedding model's vectors compared)."""

    type: ClassVar[str] = "rerank_scores"
    request_id: str
    scores: list[float]
    prompt_tokens: int
    method: str
