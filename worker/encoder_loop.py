"""The loop of an embedding or reranker worker: requests in, tokenized and checked on
arrival (a bad input fails its own request, nothing else), gathered for a short window
so that several clients' inputs share a forward pass, run in length-bucketed batches,
answers out.

`worker.main` does the handshake (`protocol.child`) and hands it the channel once the model
kind says it is an encoder; Ping and Shutdown are obeyed here as in every child.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from protocol.child import Lifecycle
from protocol.errors import RequestError
from protocol.messages import (
    PROTOCOL_VERSION,
    AbortRequest,
    EmbeddingsEvent,
    EmbedRequest,
    ErrorEvent,
    Message,
    Pong,
    Ready,
    RerankEvent,
    RerankRequest,
    StartupFailed,
    WorkerConfig,
)
from worker.cpu_kernels import install as install_cpu_kernels
from worker.length_buckets import plan_batches
from worker.text_encoder import TextEncoder

log = logging.getLogger("worker")

MAX_BATCH_ROWS = 32  # rows per forward pass
MAX_BATCH_TOKENS = 16384  # rows x padded length per forward pass: bounds its activations
_IDLE_POLL_MS = 50


class Channel(Protocol):
    def send(self, message: Message) -> None: ...

    def receive(self, timeout_ms: int) -> Message | None: ...


@dataclass
class Job:
    """One request's rows, waiting for or inside a step. `rows` are token ids (for a
    cross-encoder, a (query, document) pair each, with `segments`); `outputs` collects one
    result per row as batches finish."""

    message: EmbedRequest | RerankRequest
    rows: list[list[int]]
    segments: list[list[int]] | None = None
    arrived: float = field(default_factory=time.monotonic)
    outputs: dict[int, np.ndarray] = field(default_factory=dict)

    @property
    def request_id(self) -> str:
        return self.message.request_id


class EncoderWorker:
    """Turns EmbedRequest / RerankRequest messages into jobs and jobs into answers.

    Invariant: a job is answered exactly once, with its result or its error; a failed
    forward pass fails the jobs that had rows in it and nothing else.
    """

    def __init__(self, encoder: TextEncoder, model_id: str, send: Callable[[Message], None]) -> None:
        self.encoder = encoder
        self.model_id = model_id
        self.send = send
        self.pending: list[Job] = []

    # ---------------------------------------------------------------- arrival

    def add(self, message: EmbedRequest | RerankRequest) -> None:
        try:
            job = self._embed_job(message) if isinstance(message, EmbedRequest) else self._rerank_job(message)
        except RequestError as error:
            self.send(ErrorEvent.from_error(message.request_id, error))
            return
        self.pending.append(job)

    def abort(self, request_id: str) -> None:
        self.pending = [job for job in self.pending if job.request_id != request_id]

    def _fit(self, ids: list[int], truncate: bool, what: str, param: str) -> list[int]:
        limit = self.encoder.max_tokens
        if len(ids) <= limit:
            return ids
        if truncate:
            return self.encoder.truncate(ids)
        raise RequestError(
            f"{what} is {len(ids)} tokens, more than the {limit} tokens model '{self.model_id}' reads; "
            "shorten it, or send \"truncate\": true to cut it to the window",
            param=param, code="context_length_exceeded", num_prompt_tokens=len(ids), context_window=limit)

    def _token_ids(self, inputs: list[str | list[int]], param: str) -> list[list[int]]:
        texts = [(i, text) for i, text in enumerate(inputs) if isinstance(text, str)]
        rows: list[list[int]] = [[] for _ in inputs]
        for (i, _), ids in zip(texts, self.encoder.tokenize([t for _, t in texts]), strict=True):
            rows[i] = ids
        for i, item in enumerate(inputs):
            if isinstance(item, list):
                if any(not 0 <= t < self.encoder.vocab_size for t in item):
                    raise RequestError(f"{param}[{i}] holds a token id outside the vocabulary of model "
                                       f"'{self.model_id}' (0 to {self.encoder.vocab_size - 1})", param=param)
                rows[i] = self.encoder.frame(item)
        return rows

    def _embed_job(self, message: EmbedRequest) -> Job:
        if self.encoder.kind != "embedding":
            raise RequestError(f"model '{self.model_id}' is a {self.encoder.kind} model, not an embedding model",
                               param="model", code="wrong_model_kind")
        if message.dimensions is not None and not 0 < message.dimensions <= self.encoder.dimensions:
            raise RequestError(f"'dimensions' must be between 1 and {self.encoder.dimensions} for model "
                               f"'{self.model_id}', got {message.dimensions}", param="dimensions")
        rows = self._token_ids(message.inputs, "input")
        what = "the input" if len(rows) == 1 else "input {}"
        rows = [self._fit(ids, message.truncate, what.format(i), "input") for i, ids in enumerate(rows)]
        return Job(message, rows)

    def _rerank_job(self, message: RerankRequest) -> Job:
        if self.encoder.kind == "reranker":
            pairs = [self.encoder.pair(message.query, document) for document in message.documents]
            rows, segments = [], []
            for i, (ids, types) in enumerate(pairs):
                fitted = self._fit(ids, message.truncate, f"the query with document {i}", "documents")
                rows.append(fitted)
                segments.append(types[:len(fitted) - 1] + types[-1:] if len(fitted) < len(ids) else types)
            return Job(message, rows, segments)
        rows = self._token_ids([message.query, *message.documents], "documents")
        rows = [self._fit(ids, message.truncate, "the query" if i == 0 else f"document {i - 1}",
                          "query" if i == 0 else "documents") for i, ids in enumerate(rows)]
        return Job(message, rows)

    # ---------------------------------------------------------------- steps

    @property
    def oldest_arrival(self) -> float | None:
        return min((job.arrived for job in self.pending), default=None)

    def step(self) -> None:
        """Run every pending row, in batches of similar length, and answer every job."""
        jobs, self.pending = self.pending, []
        rows = [(job, i) for job in jobs for i in range(len(job.rows))]
        failed: dict[str, RequestError] = {}
        lengths = [len(job.rows[i]) for job, i in rows]
        for batch in plan_batches(lengths, MAX_BATCH_ROWS, MAX_BATCH_TOKENS):
            members = [rows[b] for b in batch]
            try:
                if self.encoder.kind == "reranker":
                    results = self.encoder.score([(job.rows[i], (job.segments or [])[i]) for job, i in members])
                else:
                    results = self.encoder.embed([job.rows[i] for job, i in members])
            except Exception as exc:  # one bad batch fails its own requests; the loop lives on
                log.exception("a forward pass of %d rows failed", len(members))
                for job, _ in members:
                    failed[job.request_id] = RequestError(f"the model failed on this request ({exc!r})",
                                                          status=500, error_type="server_error")
                continue
            for (job, i), result in zip(members, results, strict=True):
                job.outputs[i] = result
        for job in jobs:
            if job.request_id in failed:
                self.send(ErrorEvent.from_error(job.request_id, failed[job.request_id]))
            else:
                self.send(self._answer(job))

    def _answer(self, job: Job) -> Message:
        results = np.stack([job.outputs[i] for i in range(len(job.rows))]) if job.rows else np.zeros((0,))
        num_tokens = sum(len(row) for row in job.rows)
        message = job.message
        if isinstance(message, EmbedRequest):
            if message.dimensions is not None:
                results = results[:, :message.dimensions]
                results = results / np.maximum(np.linalg.norm(results, axis=1, keepdims=True), 1e-12)
            vectors = np.ascontiguousarray(results, dtype="<f4")
            return EmbeddingsEvent(message.request_id, vectors.shape[0], vectors.shape[1], num_tokens,
                                   vectors=vectors.tobytes())
        if self.encoder.kind == "reranker":
            return RerankEvent(message.request_id, [float(s) for s in results], num_tokens, "cross-encoder")
        query, documents = results[0], results[1:]
        norms = np.maximum(np.linalg.norm(documents, axis=1) * np.linalg.norm(query), 1e-12)
        return RerankEvent(message.request_id, [float(s) for s in documents @ query / norms], num_tokens, "cosine")


def serve_encoder(channel: Channel, config: WorkerConfig, blas: str, lifecycle: Lifecycle) -> int:
    """Load the encoder, send Ready, run the loop until told to stop or orphaned."""
    try:
        encoder = TextEncoder(config.model_path, config.kind)
    except Exception as exc:
        log.exception("failed to load %s", config.model_path)
        channel.send(StartupFailed(f"cannot load {config.kind} model {config.model_path}: {exc}"))
        return 3
    log.info("loaded %s %s in %.1fs: %d-d, %s pooling%s, window %d tokens, BLAS %s", config.kind, config.model_id,
             encoder.load_time_s, encoder.dimensions, encoder.pooling.mode,
             " + normalise" if encoder.pooling.normalize else "", encoder.max_tokens, blas)
    channel.send(Ready(
        protocol_version=PROTOCOL_VERSION, model_id=config.model_id, context_length=encoder.max_tokens,
        max_num_seqs=MAX_BATCH_ROWS, prefill_chunk_tokens=MAX_BATCH_TOKENS, block_tokens=0, dtype="float32",
        device="cpu", blas=blas, load_time_s=encoder.load_time_s, weights_bytes=encoder.weights_bytes,
        vocab_size=encoder.vocab_size, kind=config.kind, dimensions=encoder.dimensions,
        attention=install_cpu_kernels(),  # BERT's GELU and attention run on them when they passed
    ))
    worker = EncoderWorker(encoder, config.model_id, channel.send)
    window_s = config.settings.batch_window_ms / 1000
    while True:
        if lifecycle.parent_gone():
            log.warning("router went away; exiting")
            return 0
        if lifecycle.stop_requested:
            worker.step()  # what arrived is answered: an encoder step is short
            log.info("shut down cleanly")
            return 0
        oldest = worker.oldest_arrival
        if oldest is None:
            message = channel.receive(_IDLE_POLL_MS)
            if message is not None:
                _handle(message, worker, lifecycle)
            continue
        # gather: other clients' inputs of the same burst arrive within a few ms of each
        # other; a gap of a quarter window with nothing new ends the wait early, so a lone
        # request does not sit out the whole window
        deadline = oldest + window_s
        while (left_s := deadline - time.monotonic()) > 0:
            message = channel.receive(max(1, int(min(left_s, window_s / 4) * 1000)))
            if message is None:
                break
            _handle(message, worker, lifecycle)
            while (message := channel.receive(0)) is not None:
                _handle(message, worker, lifecycle)
        worker.step()


def _handle(message: Message, worker: EncoderWorker, lifecycle: Lifecycle) -> None:
    if isinstance(message, (EmbedRequest, RerankRequest)):
        worker.add(message)
    elif isinstance(message, AbortRequest):
        worker.abort(message.request_id)
    elif not lifecycle.obey(message, worker.send, lambda ping: Pong(ping.nonce, ping.sent_at, len(worker.pending))):
        log.warning("unexpected %s message; ignored", message.type)
