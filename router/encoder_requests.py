"""The one path of an embeddings or rerank request: resolve the model, check its kind,
acquire its worker (loading or fetching it, as for chat), send the request, wait for its
one answer. A bad body is refused before any model is loaded, as for chat."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from starlette.requests import Request

from protocol.errors import WorkerDead
from protocol.messages import EmbeddingsEvent, EmbedRequest, ErrorEvent, RerankEvent, RerankRequest
from router.pool import WorkerPool

logger = logging.getLogger(__name__)

EMBEDDING_KINDS = ("embedding",)
# a cross-encoder reads each (query, document) pair; an embedding model compares vectors
RERANK_KINDS = ("reranker", "embedding")


def rerank_method(kind: str) -> str:
    """What /v1/rerank runs on a model of `kind`: the name its answers and /v1/models give."""
    return "cross-encoder" if kind == "reranker" else "cosine"


async def ask_encoder(request: Request, model_id: str, message: EmbedRequest | RerankRequest,
                      kinds: Sequence[str], task: str) -> EmbeddingsEvent | RerankEvent:
    """`message`'s answer from `model_id`'s worker; a RequestError (from the worker or a
    kind that cannot serve `task`) or WorkerDead propagates to the error handlers."""
    pool: WorkerPool = request.app.state.pool
    request.state.request_id = message.request_id  # the response's x-request-id
    request.state.model = model_id  # the `model` label of mlxd_requests_total
    supervisor = await pool.acquire(model_id, kinds, task)
    stream = supervisor.open_request(message)
    stream.model = model_id
    stream.user_agent = request.headers.get("user-agent", "")
    try:
        while True:
            event = await stream.next_event()
            if isinstance(event, ErrorEvent):
                raise event.to_error()
            if isinstance(event, (EmbeddingsEvent, RerankEvent)):
                pool.last_used[model_id] = max(pool.last_used.get(model_id, 0.0), stream.created)
                logger.info("%s %s: %d tokens", model_id, message.request_id, event.prompt_tokens,
                            extra={"request_id": message.request_id})
                return event
            if event is None:  # next_event without a timeout never returns None
                raise WorkerDead(f"no answer from the worker for model '{model_id}'")
    except BaseException:
        stream.abort()  # a no-op once it finished
        raise
