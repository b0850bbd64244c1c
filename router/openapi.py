"""The OpenAPI 3.1 document of the router's routes, served at `/openapi.json`.

Kept by hand next to the route table (`router.app`) rather than generated from
docstrings: the bodies are the dialects' own (OpenAI, Anthropic), described here just
enough for a client generator or a fuzzer (schemathesis) to build valid and invalid
requests. `tests/router/test_openapi.py` keeps it true: every route is here and every
path here is a route. The served models' ids are filled in as examples of `model`.
"""

from __future__ import annotations

import copy
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from router.admin import service_version

Schema = dict[str, Any]

_MODEL: Schema = {"type": "string", "description": "a served model, `MODEL:PROFILE`, or an alias"}
_TEXT_OR_PARTS: Schema = {"anyOf": [
    {"type": "string"},
    {"type": "array", "items": {"type": "object", "required": ["type", "text"],
                                "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}},
]}
_TOOLS: Schema = {"type": "array", "items": {"type": "object", "required": ["type", "function"], "properties": {
    "type": {"const": "function"},
    "function": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string"}, "description": {"type": "string"}, "parameters": {"type": "object"}}}}}}
_INT31 = 2**31 - 1  # router.validation's bound of every count and token id
_SAMPLING: dict[str, Schema] = {
    "max_tokens": {"type": "integer", "minimum": 1, "maximum": _INT31},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"type": "integer", "minimum": -1, "maximum": _INT31},
    "seed": {"type": "integer", "minimum": -(2**63), "maximum": 2**64 - 1},
    "stop": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
    "stream": {"type": "boolean"},
    "logprobs": {"type": "boolean"},
    "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "cache_salt": {"type": "string"},
}
_CHAT: Schema = {"type": "object", "required": ["model", "messages"], "properties": {
    "model": _MODEL,
    "messages": {"type": "array", "minItems": 1, "items": {"type": "object", "required": ["role"], "properties": {
        "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": {"anyOf": [_TEXT_OR_PARTS, {"type": "null"}]},
        "tool_call_id": {"type": "string"}}}},
    **_SAMPLING,
    "max_completion_tokens": {"type": "integer", "minimum": 1, "maximum": _INT31},
    "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
    "tools": _TOOLS,
    "tool_choice": {"anyOf": [{"enum": ["auto", "none", "required"]}, {"type": "object"}]},
    "response_format": {"type": "object", "required": ["type"], "properties": {
        "type": {"enum": ["text", "json_object", "json_schema"]}, "json_schema": {"type": "object"}}},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
}}
_COMPLETION: Schema = {"type": "object", "required": ["model", "prompt"], "properties": {
    "model": _MODEL,
    "prompt": {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0, "maximum": _INT31}}]},
    **_SAMPLING,
}}
_ANTHROPIC_CONTENT: Schema = {"anyOf": [
    {"type": "string"},
    {"type": "array", "items": {"type": "object", "required": ["type"], "properties": {
        "type": {"enum": ["text", "image", "tool_use", "tool_result", "thinking"]}, "text": {"type": "string"}}}},
]}
_ANTHROPIC_MESSAGES: Schema = {"type": "array", "minItems": 1, "items": {
    "type": "object", "required": ["role", "content"],
    "properties": {"role": {"enum": ["user", "assistant"]}, "content": _ANTHROPIC_CONTENT}}}
_MESSAGES: Schema = {"type": "object", "required": ["model", "max_tokens", "messages"], "properties": {
    "model": _MODEL,
    "max_tokens": {"type": "integer", "minimum": 1, "maximum": _INT31},
    "messages": _ANTHROPIC_MESSAGES,
    "system": _ANTHROPIC_CONTENT,
    "stop_sequences": {"type": "array", "items": {"type": "string"}},
    "temperature": {"type": "number", "minimum": 0, "maximum": 1},
    "top_p": {"type": "number"},
    "top_k": {"type": "integer", "minimum": -1, "maximum": _INT31},
    "stream": {"type": "boolean"},
    "tools": {"type": "array", "items": {"type": "object", "required": ["name", "input_schema"], "properties": {
        "name": {"type": "string"}, "input_schema": {"type": "object"}}}},
}}
_COUNT_TOKENS: Schema = {"type": "object", "required": ["model", "messages"], "properties": {
    "model": _MODEL, "messages": _ANTHROPIC_MESSAGES, "system": _ANTHROPIC_CONTENT}}
_RESPONSES: Schema = {"type": "object", "required": ["model", "input"], "properties": {
    "model": _MODEL,
    "input": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
    "instructions": {"type": "string"},
    "max_output_tokens": {"type": "integer", "minimum": 1, "maximum": _INT31},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "stream": {"type": "boolean"},
    "store": {"type": "boolean"},
    "previous_response_id": {"type": "string"},
    "tools": {"type": "array", "items": {"type": "object"}},
}}
_EMBEDDINGS: Schema = {"type": "object", "required": ["model", "input"], "properties": {
    "model": _MODEL,
    "input": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}},
                        {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": _INT31}}]},
    "encoding_format": {"enum": ["float", "base64"]},
    "dimensions": {"type": "integer", "minimum": 1, "maximum": _INT31},
}}
_RERANK: Schema = {"type": "object", "required": ["model", "query", "documents"], "properties": {
    "model": _MODEL, "query": {"type": "string"},
    "documents": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "object"}]}},
    "top_n": {"type": "integer", "minimum": 1, "maximum": _INT31}, "return_documents": {"type": "boolean"}}}
_CACHE_CLEAR: Schema = {"type": "object", "properties": {"model": {"type": "string"}}}
_CACHE_PROBE: Schema = {"type": "object", "required": ["model"], "properties": {
    "model": {"type": "string"}, "api": {"type": "string", "enum": ["chat", "messages", "responses", "completions"]},
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
    "/v1/chat/completions": {"post": _op("OpenAI chat completions, streamed or not", _CHAT)},
    "/v1/completions": {"post": _op("OpenAI text completions", _COMPLETION)},
    "/v1/responses": {"post": _op("OpenAI Responses", _RESPONSES)},
    "/v1/messages": {"post": _op("Anthropic Messages", _MESSAGES)},
    "/v1/messages/count_tokens": {"post": _op("exact prompt tokens of a Messages body", _COUNT_TOKENS)},
    "/v1/embeddings": {"post": _op("OpenAI embeddings", _EMBEDDINGS)},
    "/v1/rerank": {"post": _op("documents ranked against a query (Cohere / Jina shape)", _RERANK)},
    "/v2/rerank": {"post": _op("the same, on Cohere's v2 path", _RERANK)},
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


def openapi_document(model_ids: list[str]) -> Schema:
    """The document, with `model_ids` as the examples of every body's `model`."""
    paths = copy.deepcopy(PATHS)
    for methods in paths.values():
        for operation in methods.values():
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if body is not None and "model" in body.get("properties", {}) and model_ids:
                body["properties"]["model"]["examples"] = model_ids
    return {"openapi": "3.1.0", "info": {"title": "mlxd", "version": service_version()}, "paths": paths}


async def openapi_json(request: Request) -> JSONResponse:
    """The route: the document with the models this service serves."""
    return JSONResponse(openapi_document(list(request.app.state.pool.models)))
