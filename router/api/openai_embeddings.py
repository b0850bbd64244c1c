"""POST /v1/embeddings in OpenAI's shape: `input` as a string, strings, token ids or lists
of token ids; `encoding_format` float or base64 (little-endian float32, what the openai
SDK asks for by default); `dimensions`; mlxd's `truncate` for inputs over the window."""

from __future__ import annotations

import array
import base64
import logging
import sys
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from protocol.messages import EmbeddingsEvent, EmbedRequest
from router.api import schemas
from router.api.dialect_entry import DialectEntry, Endpoint
from router.json_body import parse_json_body
from router.children.pool import WorkerPool
from router.requests import ask, model_name
from router.validation import MAX_TOKEN_ID, bad, flag, integer, is_int, optional_str, short

logger = logging.getLogger(__name__)

EMBEDDING_KINDS = ("embedding",)
MAX_INPUTS = 2048  # OpenAI's limit per request
MAX_DIMENSIONS = 1 << 16
ENCODING_FORMATS = ("float", "base64")


def _token_ids(value: list[Any], where: str) -> list[int]:
    if not value:
        raise bad("input", f"{where} is an empty list of token ids")
    if not all(is_int(t) and 0 <= t <= MAX_TOKEN_ID for t in value):
        raise bad("input", f"{where} must hold non-negative integer token ids")
    return value


def parse_inputs(value: Any) -> list[str | list[int]]:
    """`input` as a list of texts and token-id lists, each non-empty; a 400 naming the
    first bad one otherwise."""
    if isinstance(value, str):
        value = [value]
    elif isinstance(value, list) and value and all(is_int(t) for t in value):
        value = [value]  # one input as token ids
    if not isinstance(value, list) or not value:
        raise bad("input", "'input' is required: a non-empty string, a list of strings, a list of token ids or "
                           f"a list of token-id lists; got {short(value)}")
    if len(value) > MAX_INPUTS:
        raise bad("input", f"'input' holds {len(value)} inputs; at most {MAX_INPUTS} per request")
    inputs: list[str | list[int]] = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            if not item:
                raise bad("input", f"'input[{i}]' is an empty string; every input needs text")
            inputs.append(item)
        elif isinstance(item, list):
            inputs.append(_token_ids(item, f"'input[{i}]'"))
        else:
            raise bad("input", f"'input[{i}]' must be a string or a list of token ids, got {short(item)}")
    return inputs


def parse(body: dict[str, Any]) -> tuple[EmbedRequest, str]:
    """The body -> (the worker's request, the encoding_format to answer in)."""
    inputs = parse_inputs(body.get("input"))
    encoding = body.get("encoding_format", "float")
    if encoding is None:
        encoding = "float"
    if encoding not in ENCODING_FORMATS:
        raise bad("encoding_format", f"'encoding_format' must be 'float' or 'base64', got {short(encoding)}")
    optional_str(body, "user")
    message = EmbedRequest(request_id=f"emb-{uuid.uuid4().hex}", inputs=inputs, truncate=flag(body, "truncate"),
                           dimensions=integer(body, "dimensions", 1, MAX_DIMENSIONS))
    return message, encoding


def _floats(vectors: bytes) -> array.array[float]:
    values = array.array("f", vectors)
    if sys.byteorder == "big":  # the wire carries little-endian float32
        values.byteswap()
    return values


def answer(event: EmbeddingsEvent, model: str, encoding: str) -> dict[str, Any]:
    """OpenAI's embeddings list from the worker's vectors."""
    row_bytes = event.dimensions * 4
    data = []
    for i in range(event.num_inputs):
        row = bytes(event.vectors[i * row_bytes:(i + 1) * row_bytes])
        embedding: Any = base64.b64encode(row).decode("ascii") if encoding == "base64" else _floats(row).tolist()
        data.append({"object": "embedding", "index": i, "embedding": embedding})
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": event.prompt_tokens, "total_tokens": event.prompt_tokens}}


async def embeddings(request: Request) -> Response:
    pool: WorkerPool = request.app.state.pool
    body = parse_json_body(await request.body())
    name = model_name(body)
    model_id, _ = pool.resolve(name)
    message, encoding = parse(body)
    event = await ask(request, model_id, message, EmbeddingsEvent, kinds=EMBEDDING_KINDS, task="embeddings")
    assert event is not None  # asked with load: a model that cannot answer raises
    logger.info("%s %s: %d tokens", model_id, message.request_id, event.prompt_tokens,
                extra={"request_id": message.request_id})
    return JSONResponse(answer(event, name, encoding))


ENTRY = DialectEntry(
    "embeddings", (Endpoint("/v1/embeddings", "POST", embeddings, "OpenAI embeddings", schemas.EMBEDDINGS),))
