"""The OpenAPI 3.1 document of the router's routes, served at `/openapi.json`.

Kept by hand next to the route table (`router.app`) rather than generated from
docstrings: the dialects' routes come from their registry (`router.api.registry`) with
their bodies (`router.api.schemas`), described just enough for a client generator or a
fuzzer (schemathesis) to build valid and invalid requests; the other routes are here. `tests/router/test_openapi.py` keeps it true: every route is here and every
path here is a route. The served models' ids are filled in as examples of `model`.
"""

from __future__ import annotations

import copy
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from router.admin import service_version
from router.api.registry import DIALECTS, prompt_dialects

Schema = dict[str, Any]

_CACHE_CLEAR: Schema = {"type": "object", "properties": {"model": {"type": "string"}}}
_CACHE_PROBE: Schema = {"type": "object", "required": ["model"], "properties": {
    "model": {"type": "string"}, "api": {"type": "string", "enum": [d.name for d in prompt_dialects()]},
    "messages": {"type": "array"}, "system": {}, "input": {}, "prompt": {}, "tools": {"type": "array"}}}
_SNAPSHOT: Schema = {"type": "object", "required": ["name", "model"], "properties": {
    "name": {"type": "string"}, "model": {"type": "string"}, "messages": {"type": "array"}, "prompt": {}}}

_ANSWER = {"default": {"description": "the answer, or an error in the route's API shape "
                                      "(OpenAI `{\"error\": {...}}`, Anthropic `{\"type\": \"error\", ...}`)"}}
_MODEL_ID = [{"name": "model_id", "in": "path", "required": True, "schema": {"type": "string"}}]


def _op(summary: str, body: Schema | None = None, parameters: list[Schema] | None = None) -> Schema:
    operation: Schema = {"summary": summary, "responses": _ANSWER}
    if body is not None:
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    if parameters:
        operation["parameters"] = parameters
    return operation


PATHS: dict[str, dict[str, Schema]] = {
    "/health": {"get": _op("service and worker health: 200 ok, 503 starting / draining / degraded")},
    "/api/hello": {"get": _op("Claude Code's start-up probe (HEAD too)")},
    "/openapi.json": {"get": _op("this document")},
    "/v1/models": {"get": _op("the served models (Anthropic's shape with an anthropic-version header)")},
    "/v1/models/{model_id}": {"get": _op("one model", parameters=_MODEL_ID)},
    "/metrics": {"get": _op("Prometheus metrics (text format); the admin key rule of /admin")},
    "/admin": {"get": _op("the dashboard (HTML)")},
    "/admin/": {"get": _op("the dashboard (HTML)")},
    "/admin/dashboard/{path}": {"get": _op("the dashboard's static script and style", parameters=[
        {"name": "path", "in": "path", "required": True, "schema": {"type": "string"}}])},
    "/admin/status": {"get": _op("JSON status for ops scripts")},
    "/admin/models/{model_id}/load": {"post": _op("load a model", parameters=_MODEL_ID)},
    "/admin/models/{model_id}/unload": {"post": _op("unload a model", parameters=_MODEL_ID)},
    "/admin/models/{model_id}/pin": {"post": _op("pin a model (load it, never evict it)", parameters=_MODEL_ID)},
    "/admin/models/{model_id}/unpin": {"post": _op("unpin a model", parameters=_MODEL_ID)},
    "/admin/workers/{model_id}/restart": {"post": _op("restart a model's worker; its cache comes back from SSD",
                                                      parameters=_MODEL_ID)},
    "/admin/cache": {"get": _op("the prefix cache per model", parameters=[
        {"name": "model", "in": "query", "required": False, "schema": {"type": "string"}}])},
    "/admin/cache/clear": {"post": {**_op("drop a model's cached blocks (or every model's)"), "requestBody": {
        "required": False, "content": {"application/json": {"schema": _CACHE_CLEAR}}}}},
    "/admin/cache/probe": {"post": _op("how many leading tokens of a request body (any API's shape) are hot, on "
                                       "SSD or missing, with the block keys; runs nothing, moves no LRU order",
                                       _CACHE_PROBE)},
    "/admin/cache/snapshots": {
        "get": _op("the named snapshots: pinned prefixes with their tokens, blocks and bytes"),
        "post": _op("pin a prompt's whole blocks under a name in both tiers (computing what is missing)",
                    _SNAPSHOT)},
    "/admin/cache/snapshots/{name}": {"delete": _op("unpin a snapshot", parameters=[
        {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}])},
    "/admin/reload": {"post": _op("re-read the config file and the key file")},
}


def _dialect_paths() -> dict[str, dict[str, Schema]]:
    """Every dialect's routes, from the registry."""
    paths: dict[str, dict[str, Schema]] = {}
    for dialect in DIALECTS:
        for endpoint in dialect.endpoints:
            paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = _op(endpoint.summary, endpoint.schema)
    return paths


def openapi_document(model_ids: list[str]) -> Schema:
    """The document, with `model_ids` as the examples of every body's `model`."""
    paths = copy.deepcopy({**PATHS, **_dialect_paths()})
    for methods in paths.values():
        for operation in methods.values():
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if body is not None and "model" in body.get("properties", {}) and model_ids:
                body["properties"]["model"]["examples"] = model_ids
    return {"openapi": "3.1.0", "info": {"title": "mlxd", "version": service_version()}, "paths": paths}


async def openapi_json(request: Request) -> JSONResponse:
    """The route: the document with the models this service serves."""
    return JSONResponse(openapi_document(list(request.app.state.pool.models)))
