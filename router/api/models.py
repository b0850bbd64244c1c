"""GET /v1/models and /v1/models/{id}: every model the pool can serve, and every profile;
in OpenAI's shape, or in Anthropic's for a request with an `anthropic-version` header."""

from __future__ import annotations

import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from protocol.context_window import served_context_length
from protocol.errors import RequestError
from protocol.settings import layout_in_effect
from router.api import anthropic_errors
from router.api.anthropic_dialect import VERSION_HEADER
from router.api.openai_format import model_card
from router.api.rerank import rerank_method
from router.children.pool import WorkerPool
from router.profiles import Profile
from router.reasoning_split import reasoning_info


def _card(pool: WorkerPool, name: str) -> dict[str, Any]:
    model_id, profile = pool.resolve(name)
    supervisor = pool.supervisors.get(model_id)
    extra: dict[str, Any] = {"kind": pool.registry[model_id].kind, "state": pool.state_of(model_id),
                             "pinned": model_id in pool.pinned}
    if profile is not None:
        extra["profile_of"] = model_id
    elif name != model_id:
        extra["alias_of"] = model_id  # which model answers this name (model_aliases, a model's aliases)
    kind = pool.registry[model_id].kind
    if kind != "chat":  # what /v1/rerank runs on it
        extra["rerank_method"] = rerank_method(kind)
    if supervisor is not None and supervisor.ready is not None:
        extra["context_length"] = supervisor.ready.context_length
        if kind == "chat":
            extra["tool_dialect"] = supervisor.ready.tool_dialect
            extra["reasoning"] = reasoning_info(supervisor.ready)
            extra["vision"] = supervisor.ready.vision  # its requests may carry images
            requested = (profile.prompt_layout if profile is not None else None) or pool.config.worker.prompt_layout
            extra["prompt_layout"] = layout_in_effect(requested, supervisor.ready.tools_first)
        if supervisor.ready.dimensions:
            extra["dimensions"] = supervisor.ready.dimensions
    if kind == "chat":
        extra.update(_chat_limits(pool, model_id, profile, extra.get("context_length")))
        if name == model_id and model_id == pool.names.default_model:
            extra["default"] = True  # what `claude-*` names reach (model_aliases' "<default>")
    return model_card(name, pool.created, **extra)


def _chat_limits(pool: WorkerPool, model_id: str, profile: Profile | None, loaded: int | None) -> dict[str, int]:
    """The window and output cap a request under this name gets, also before the model is
    loaded (its window read from its config.json, as the worker will read it), so an agent
    can be told them without loading anything (`mlxd launch`)."""
    limits: dict[str, int] = {}
    declared = pool.registry[model_id].context_length
    window = loaded if loaded is not None else (
        served_context_length(declared, pool.config.worker.max_context_tokens) if declared else None)
    if window is not None and profile is not None and profile.context_limit is not None:
        window = min(window, profile.context_limit)
    if window is not None:
        limits["context_length"] = window
    cap = pool.config.output_cap_for(model_id, profile)
    limits["max_output_tokens"] = min(pool.config.worker.max_output_tokens, cap or pool.config.worker.max_output_tokens)
    return limits


def _anthropic_card(pool: WorkerPool, name: str) -> dict[str, Any]:
    """Anthropic's model object. Every name is resolved first, so an unknown one is the 404
    it would be in a request."""
    pool.resolve(name)
    created = datetime.datetime.fromtimestamp(pool.created, datetime.UTC)
    return {"type": "model", "id": name, "display_name": name,
            "created_at": created.isoformat().replace("+00:00", "Z")}


def _is_anthropic(request: Request) -> bool:
    """Anthropic's SDKs and Claude Code send `anthropic-version` on every request; OpenAI's never."""
    return VERSION_HEADER in request.headers


async def list_models(request: Request) -> Response:
    pool: WorkerPool = request.app.state.pool
    names = pool.names.listing()
    if _is_anthropic(request):  # one page with everything: nothing to page through
        return JSONResponse({"data": [_anthropic_card(pool, m) for m in names], "has_more": False,
                             "first_id": names[0] if names else None, "last_id": names[-1] if names else None})
    return JSONResponse({"object": "list", "data": [_card(pool, m) for m in names]})


async def get_model(request: Request) -> Response:
    pool: WorkerPool = request.app.state.pool
    name = request.path_params["model_id"]
    if not _is_anthropic(request):
        return JSONResponse(_card(pool, name))
    try:
        return JSONResponse(_anthropic_card(pool, name))
    except RequestError as exc:  # the 404 in the shape the client reads
        return anthropic_errors.answer_error(exc)
