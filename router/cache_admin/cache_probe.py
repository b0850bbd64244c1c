"""`POST /admin/cache/probe`: where a prompt is cached, without running the model.

The body is any request the service takes (chat `messages` with optional `tools`,
Anthropic `system` + `messages`, Responses `input`, completions `prompt`) plus `model`;
it is parsed by that API's own parser, so the prompt probed is exactly the one that
request would send (profile, billing-line rule, tools and salt included). The model's
worker renders and tokenizes it on its tokenizer thread and looks its blocks up in the
hot tier and the kvstore without using them: no recency changes in either tier and no
hit is counted. The model is loaded if it is not (its tokenizer lives in its worker), as
a request or a token count would load it. The answer's shape is in the README ("Cache
probe and snapshots"); keep the two in step.
"""

from __future__ import annotations

import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from protocol.messages import AddRequest, CacheProbed, ProbeCache
from router import old_names
from router.api.dialect_entry import DialectEntry
from router.api.openai_format import misses_body
from router.api.registry import prompt_dialects
from router.call_memory import mark_history
from router.images import inline_images
from router.json_body import parse_json_body
from router.children.pool import WorkerPool
from router.requests import ask, model_name
from router.validation import bad

# The worker answers from its tokenizer thread, after the prompts queued there before.
WORKER_ANSWER_TIMEOUT_S = 120.0


def detect_api(body: dict[str, Any], headers: Any) -> DialectEntry:
    """Which dialect `body` is in: its `api` field if given, else the first in the
    registry's order that claims it (`router.api.registry`)."""
    dialects = prompt_dialects()
    api = body.get("api")
    if api is not None:
        named = next((d for d in dialects if d.name == api), None)
        if named is None:
            raise bad("api", f"'api' must be one of {', '.join(d.name for d in dialects)}, got {api!r}")
        return named
    for dialect in dialects:
        if dialect.claims is not None and dialect.claims(body, headers):
            return dialect
    raise bad("messages", "give the prompt as a request of any API would: 'messages' (chat or Anthropic "
              "Messages), 'input' (Responses) or 'prompt' (completions)")


def prompt_request(request: Request, pool: WorkerPool, body: dict[str, Any],
                   extra_fields: tuple[str, ...] = ()) -> tuple[str, str, AddRequest]:
    """(model id, API, the AddRequest that API's parser makes of `body`), under an id of
    its own. `extra_fields` are the route's own fields (a snapshot's `name`), kept out of
    the parser's sight."""
    fields = {k: v for k, v in body.items() if k != "api" and k not in extra_fields}
    dialect = detect_api(body, request.headers)
    model_id, profile = pool.resolve(model_name(fields))
    assert dialect.prompt is not None  # prompt_dialects() holds only those with one
    add = dialect.prompt(request, fields, profile)
    add.request_id = f"cache-{uuid.uuid4().hex[:24]}"
    inline_images(add)
    mark_history(request.app.state, model_id, add)  # as a generation of this body renders it
    return model_id, dialect.name, add


def probe_body(model_id: str, api: str, probed: CacheProbed) -> dict[str, Any]:
    """The JSON answer of a probe (also the `probe` part of a snapshot's creation), the
    old names of renamed fields included (`router.old_names`)."""
    cached = probed.hot_tokens + probed.cold_tokens
    return old_names.with_old_keys({
        "object": "cache.probe",
        "model": model_id,
        "api": api,
        "prompt_tokens": probed.prompt_tokens,
        "block_tokens": probed.block_tokens,
        "hot_tokens": probed.hot_tokens,
        "cold_tokens": probed.cold_tokens,
        "missing_tokens": probed.prompt_tokens - cached,
        "cached_tokens": cached,
        "tail_tokens": probed.tail_tokens,
        "hot_blocks": probed.hot_blocks,
        "cold_blocks": probed.cold_blocks,
        "blocks": [old_names.with_old_keys({"index": i, "key": key.hex(), "tier": tier, "in_cold_tier": in_cold,
                                            "pinned": pinned}, old_names.PROBE_BLOCK)
                   for i, (key, tier, in_cold, pinned)
                   in enumerate(zip(probed.keys, probed.tiers, probed.in_cold_tier, probed.pinned))],
        "cold_tier": probed.cold_tier,
        "prefix_cache": probed.prefix_cache,
        **misses_body(probed.misses),
    }, old_names.PROBE)


async def probe_prompt(request: Request, model_id: str, add: AddRequest) -> CacheProbed:
    """The worker's probe of `add` (its tokenizer lives there), on its tokenizer thread,
    after the prompts queued there before: bounded by WORKER_ANSWER_TIMEOUT_S."""
    probed = await ask(request, model_id, ProbeCache(add), CacheProbed, timeout_s=WORKER_ANSWER_TIMEOUT_S)
    assert probed is not None  # asked with load: a model that cannot answer raises
    return probed


async def probe(request: Request) -> Response:
    """POST /admin/cache/probe: how many leading tokens of the body's prompt are hot, in
    the cold tier or missing for its model, and each whole block's key and tier."""
    pool: WorkerPool = request.app.state.pool
    body = parse_json_body(await request.body())
    model_id, api, add = prompt_request(request, pool, body)
    probed = await probe_prompt(request, model_id, add)
    return JSONResponse(probe_body(model_id, api, probed))
