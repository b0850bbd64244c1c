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

from protocol.errors import ProtocolError, RequestError
from protocol.messages import AddRequest, CacheProbed, ErrorEvent, Message, ProbeCache
from router.api import openai_chat, openai_completions, openai_responses
from router.api.openai_format import misses_body
from router.api.anthropic_count_tokens import count_request
from router.call_memory import mark_history
from router.json_body import parse_json_body
from router.pool import WorkerPool
from router.requests import model_name
from router.supervisor import WorkerSupervisor
from router.validation import bad

# The worker answers from its tokenizer thread, after the prompts queued there before.
WORKER_ANSWER_TIMEOUT_S = 120.0

APIS = ("chat", "messages", "responses", "completions")
# content blocks only Anthropic's Messages API has
_ANTHROPIC_BLOCKS = frozenset({"tool_use", "tool_result", "thinking", "redacted_thinking", "image", "document"})


def detect_api(body: dict[str, Any], headers: Any) -> str:
    """Which API `body` is in: its `api` field if given, else `prompt` -> completions,
    `input` -> responses, `messages` -> Anthropic Messages when it has a top-level
    `system`, Anthropic-only content blocks or tools (`input_schema`), or the request an
    `anthropic-version` header; else OpenAI chat."""
    api = body.get("api")
    if api is not None:
        if api not in APIS:
            raise bad("api", f"'api' must be one of {', '.join(APIS)}, got {api!r}")
        return api
    if "prompt" in body:
        return "completions"
    if "input" in body:
        return "responses"
    if "messages" not in body:
        raise bad("messages", "give the prompt as a request of any API would: 'messages' (chat or Anthropic "
                  "Messages), 'input' (Responses) or 'prompt' (completions)")
    if "system" in body or headers.get("anthropic-version") is not None:
        return "messages"
    tools = body.get("tools")
    if isinstance(tools, list) and any(isinstance(t, dict) and "input_schema" in t for t in tools):
        return "messages"
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(isinstance(b, dict) and b.get("type") in _ANTHROPIC_BLOCKS
                                             for b in content):
            return "messages"
    return "chat"


def prompt_request(request: Request, pool: WorkerPool, body: dict[str, Any],
                   extra_fields: tuple[str, ...] = ()) -> tuple[str, str, AddRequest]:
    """(model id, API, the AddRequest that API's parser makes of `body`), under an id of
    its own. `extra_fields` are the route's own fields (a snapshot's `name`), kept out of
    the parser's sight."""
    fields = {k: v for k, v in body.items() if k != "api" and k not in extra_fields}
    api = detect_api(body, request.headers)
    model_id, profile = pool.resolve(model_name(fields))
    if api == "chat":
        add = openai_chat.parse(fields, profile).add
    elif api == "completions":
        add = openai_completions.parse(fields, profile).add
    elif api == "responses":
        add = openai_responses.parse(fields, profile, store=openai_responses.store_of(request)).add
    else:  # as /v1/messages/count_tokens renders it (no max_tokens needed: nothing is generated)
        add = count_request(fields, profile, pool.config.normalize_billing_header)
    add.request_id = f"cache-{uuid.uuid4().hex[:24]}"
    mark_history(request.app.state, model_id, add)  # as a generation of this body renders it
    return model_id, api, add


async def ask_worker(supervisor: WorkerSupervisor, question: Message, answer_type: type[Message],
                     user_agent: str = "", timeout_s: float = WORKER_ANSWER_TIMEOUT_S) -> Any:
    """Send a one-answer request to the worker and return its answer; its ErrorEvent is
    raised as the RequestError it carries, silence past `timeout_s` is a 503, and a dead
    worker a 503 (`WorkerDead`)."""
    stream = supervisor.open_request(question)  # type: ignore[arg-type]
    stream.model, stream.user_agent = supervisor.model_id, user_agent
    try:
        answer = await stream.next_event(timeout=timeout_s)
    finally:
        stream.abort()  # a no-op once answered; frees the worker of a question nobody waits on
    if answer is None:
        raise RequestError(f"the worker of '{supervisor.model_id}' did not answer within {timeout_s:.0f} s; retry",
                           status=503, error_type="server_error", code="worker_busy")
    if isinstance(answer, ErrorEvent):
        raise answer.to_error()
    if not isinstance(answer, answer_type):
        raise ProtocolError(f"expected {answer_type.__name__} from the worker, got {type(answer).__name__}")
    return answer


def probe_body(model_id: str, api: str, probed: CacheProbed) -> dict[str, Any]:
    """The JSON answer of a probe (also the `probe` part of a snapshot's creation)."""
    cached = probed.hot_tokens + probed.ssd_tokens
    return {
        "object": "cache.probe",
        "model": model_id,
        "api": api,
        "prompt_tokens": probed.prompt_tokens,
        "block_tokens": probed.block_tokens,
        "hot_tokens": probed.hot_tokens,
        "ssd_tokens": probed.ssd_tokens,
        "missing_tokens": probed.prompt_tokens - cached,
        "cached_tokens": cached,
        "tail_tokens": probed.tail_tokens,
        "hot_blocks": probed.hot_blocks,
        "ssd_blocks": probed.ssd_blocks,
        "blocks": [{"index": i, "key": key.hex(), "tier": tier, "on_ssd": on_ssd, "pinned": pinned}
                   for i, (key, tier, on_ssd, pinned)
                   in enumerate(zip(probed.keys, probed.tiers, probed.on_ssd, probed.pinned))],
        "cold_tier": probed.cold_tier,
        "prefix_cache": probed.prefix_cache,
        **misses_body(probed.misses),
    }


async def probe_prompt(request: Request, pool: WorkerPool, model_id: str, add: AddRequest) -> CacheProbed:
    supervisor = await pool.acquire(model_id)  # the model's tokenizer lives in its worker
    return await ask_worker(supervisor, ProbeCache(add), CacheProbed, request.headers.get("user-agent", ""))


async def probe(request: Request) -> Response:
    """POST /admin/cache/probe: how many leading tokens of the body's prompt are hot, on
    SSD or missing for its model, and each whole block's key and tier."""
    pool: WorkerPool = request.app.state.pool
    body = parse_json_body(await request.body())
    model_id, api, add = prompt_request(request, pool, body)
    probed = await probe_prompt(request, pool, model_id, add)
    return JSONResponse(probe_body(model_id, api, probed))
