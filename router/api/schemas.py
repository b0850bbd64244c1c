"""The request bodies of the dialects, as JSON Schema for /openapi.json: what each API
accepts, so a client generator or a person sees the fields without reading the parsers.
Each dialect's entry in `router.api.dialects` names its schema here."""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

MODEL: Schema = {"type": "string", "description": "a served model, `MODEL:PROFILE`, or an alias"}
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
CHAT: Schema = {"type": "object", "required": ["model", "messages"], "properties": {
    "model": MODEL,
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
COMPLETION: Schema = {"type": "object", "required": ["model", "prompt"], "properties": {
    "model": MODEL,
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
MESSAGES: Schema = {"type": "object", "required": ["model", "max_tokens", "messages"], "properties": {
    "model": MODEL,
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
COUNT_TOKENS: Schema = {"type": "object", "required": ["model", "messages"], "properties": {
    "model": MODEL, "messages": _ANTHROPIC_MESSAGES, "system": _ANTHROPIC_CONTENT}}
RESPONSES: Schema = {"type": "object", "required": ["model", "input"], "properties": {
    "model": MODEL,
    "input": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
    "instructions": {"type": "string"},
    "max_output_tokens": {"type": "integer", "minimum": 1, "maximum": _INT31},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "stream": {"type": "boolean"},
    "store": {"type": "boolean"},
    "previous_response_id": {"type": "string"},
    "tools": {"type": "array", "items": {"type": "object"}},
}}
EMBEDDINGS: Schema = {"type": "object", "required": ["model", "input"], "properties": {
    "model": MODEL,
    "input": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}},
                        {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": _INT31}}]},
    "encoding_format": {"enum": ["float", "base64"]},
    "dimensions": {"type": "integer", "minimum": 1, "maximum": _INT31},
}}
RERANK: Schema = {"type": "object", "required": ["model", "query", "documents"], "properties": {
    "model": MODEL, "query": {"type": "string"},
    "documents": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "object"}]}},
    "top_n": {"type": "integer", "minimum": 1, "maximum": _INT31}, "return_documents": {"type": "boolean"}}}
