"""POST /v1/rerank (and /v2/rerank) in the Cohere / Jina shape other servers use: a query
and documents (strings or objects with `text`) in; `results` with each document's `index`
and `relevance_score`, best first, out. The answer says which method scored them: a
cross-encoder's classification head, or the embedding model's cosine similarity."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from protocol.messages import RerankEvent, RerankRequest
from router.api import schemas
from router.api.dialect_entry import DialectEntry, Endpoint
from router.api.openai_embeddings import MAX_INPUTS
from router.json_body import parse_json_body
from router.children.pool import WorkerPool
from router.requests import ask, model_name
from router.validation import bad, flag, integer, short

logger = logging.getLogger(__name__)

# a cross-encoder reads each (query, document) pair; an embedding model compares vectors
RERANK_KINDS = ("reranker", "embedding")


def rerank_method(kind: str) -> str:
    """What /v1/rerank runs on a model of `kind`: the name its answers and /v1/models give."""
    return "cross-encoder" if kind == "reranker" else "cosine"


def _documents(value: Any) -> list[str]:
    if not isinstance(value, list) or not value:
        raise bad("documents", f"'documents' is required: a non-empty list of strings or {{\"text\": ...}} objects; "
                               f"got {short(value)}")
    if len(value) > MAX_INPUTS:
        raise bad("documents", f"'documents' holds {len(value)} documents; at most {MAX_INPUTS} per request")
    texts = []
    for i, item in enumerate(value):
        text = item.get("text") if isinstance(item, dict) else item
        if not isinstance(text, str):
            raise bad("documents", f"'documents[{i}]' must be a string or an object with a string 'text', "
                                   f"got {short(item)}")
        texts.append(text)
    return texts


def parse(body: dict[str, Any]) -> tuple[RerankRequest, int, bool]:
    """The body -> (the worker's request, top_n, return_documents)."""
    query = body.get("query")
    if not isinstance(query, str) or not query:
        raise bad("query", f"'query' is required and must be a non-empty string, got {short(query)}")
    documents = _documents(body.get("documents"))
    top_n = integer(body, "top_n", 1, MAX_INPUTS)
    message = RerankRequest(request_id=f"rerank-{uuid.uuid4().hex}", query=query, documents=documents,
                            truncate=flag(body, "truncate"))
    return message, top_n or len(documents), flag(body, "return_documents")


def answer(event: RerankEvent, message: RerankRequest, model: str, top_n: int, with_documents: bool) -> dict[str, Any]:
    order = sorted(range(len(event.scores)), key=lambda i: (-event.scores[i], i))[:top_n]
    results = []
    for i in order:
        result: dict[str, Any] = {"index": i, "relevance_score": event.scores[i]}
        if with_documents:
            result["document"] = {"text": message.documents[i]}
        results.append(result)
    return {"id": message.request_id, "model": model, "method": event.method, "results": results,
            "usage": {"prompt_tokens": event.prompt_tokens, "total_tokens": event.prompt_tokens}}


async def rerank(request: Request) -> Response:
    pool: WorkerPool = request.app.state.pool
    body = parse_json_body(await request.body())
    name = model_name(body)
    model_id, _ = pool.resolve(name)
    message, top_n, with_documents = parse(body)
    event = await ask(request, model_id, message, RerankEvent, kinds=RERANK_KINDS, task="rerank")
    assert event is not None  # asked with load: a model that cannot answer raises
    logger.info("%s %s: %d tokens", model_id, message.request_id, event.prompt_tokens,
                extra={"request_id": message.request_id})
    return JSONResponse(answer(event, message, name, top_n, with_documents))


ENTRY = DialectEntry("rerank", (
    Endpoint("/v1/rerank", "POST", rerank, "documents ranked against a query (Cohere / Jina shape)", schemas.RERANK),
    Endpoint("/v2/rerank", "POST", rerank, "the same, on Cohere's v2 path", schemas.RERANK),  # Cohere's v2 path
))
