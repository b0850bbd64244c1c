"""POST /v1/messages/count_tokens: how many input tokens a Messages request would be.

The count is exact: the body is parsed as /v1/messages parses it, and the worker renders
and tokenizes the result with the model's own chat template and tokenizer, as it would to
generate. It runs on the worker's tokenizer thread, never in the generation queue, since
Claude Code's `/context` sends 26 at once and expects them back while a turn is running.
A prompt longer than the context window is counted, not refused: knowing by how much it
is over is the point of asking.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from protocol.messages import AddRequest, CountTokens, TokenCount
from router.api import anthropic_messages
from router.api.anthropic_errors import answer_error
from router.call_memory import mark_history
from router.images import inline_images
from router.json_body import parse_json_body
from router.children.pool import WorkerPool
from router.profiles import Profile
from router.requests import ask, model_name

# a count has no answer, but the Messages parser requires Anthropic's max_tokens
_PLACEHOLDER_MAX_TOKENS = 1


def count_request(body: dict[str, Any], profile: Profile | None, normalize_billing_header: bool) -> AddRequest:
    """The request whose prompt is counted: the body as /v1/messages would send it (the
    same messages, tools, profile and billing-line rule), under an id of its own."""
    if body.get("max_tokens") is None:
        body = {**body, "max_tokens": _PLACEHOLDER_MAX_TOKENS}
    parse = functools.partial(anthropic_messages.parse, normalize_billing_header=normalize_billing_header)
    add = parse(body, profile).add
    add.request_id = f"count_{uuid.uuid4().hex[:24]}"
    return add


async def count_tokens(request: Request) -> Response:
    """The route: every failure is an Anthropic error response."""
    try:
        return await _count(request)
    except Exception as exc:  # noqa: BLE001  (any failure answers in Anthropic's shape; answer_error logs bugs)
        return answer_error(exc)


async def _count(request: Request) -> Response:
    pool: WorkerPool = request.app.state.pool
    body = parse_json_body(await request.body())
    model_id, profile = pool.resolve(model_name(body))
    request.state.model = model_id  # the `model` label of mlxd_requests_total
    add = count_request(body, profile, pool.config.normalize_billing_header)
    inline_images(add)
    mark_history(request.app.state, model_id, add)  # exact: rendered as a generation of this body would be
    answer = await ask(request, model_id, CountTokens(add), TokenCount)  # the tokenizer lives in the worker
    assert answer is not None  # asked with load: a model that cannot answer raises
    return JSONResponse({"input_tokens": answer.num_tokens})
