"""OpenAI response objects: completion bodies, stream chunks, usage, model cards.

Pure functions of their arguments (no I/O), so the exact wire shapes are unit-tested.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from protocol.cache_misses import CacheMisses
from protocol.messages import Timings, Usage
from router import old_names
from router.tool_calls.events import ToolCall

CHAT_CHUNK = "chat.completion.chunk"
TEXT_COMPLETION = "text_completion"


def usage_body(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


def _chunk(kind: str, request_id: str, model: str, created: int, choice: dict[str, Any],
           include_usage: bool) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": request_id,
        "object": CHAT_CHUNK if kind == "chat" else TEXT_COMPLETION,
        "created": created,
        "model": model,
        "choices": [choice],
    }
    if include_usage:
        chunk["usage"] = None  # OpenAI sends null on every chunk but the last
    return chunk


def stream_chunk(kind: str, request_id: str, model: str, created: int, *, text: str | None = None,
                 role: str | None = None, finish_reason: str | None = None,
                 include_usage: bool = False, tool_calls: list[dict[str, Any]] | None = None,
                 logprobs: dict[str, Any] | None = None, reasoning: str | None = None) -> dict[str, Any]:
    """One streamed choice update: chat chunks carry a `delta`, text ones a `text`;
    `logprobs` (router.api.logprobs) those of the tokens it carries."""
    if kind == "chat":
        delta: dict[str, Any] = {}
        if role is not None:
            delta["role"] = role
        if text is not None:
            delta["content"] = text
        if reasoning is not None:  # the model's reasoning span, as DeepSeek's and vLLM's APIs carry it
            delta["reasoning_content"] = reasoning
        if tool_calls is not None:
            delta["tool_calls"] = tool_calls
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
    return _chunk(kind, request_id, model, created, choice, include_usage)


def tool_call_start_delta(index: int, call_id: str, name: str) -> dict[str, Any]:
    """The first delta of a streamed call: its id, type and name, no arguments yet."""
    return {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}


def tool_call_arguments_delta(index: int, fragment: str) -> dict[str, Any]:
    """A further delta of call `index`: a piece of its arguments' JSON text."""
    return {"index": index, "function": {"arguments": fragment}}


def message_tool_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """A non-streamed message's `tool_calls`."""
    return [{"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in calls]


def usage_chunk(kind: str, request_id: str, model: str, created: int, usage: Usage) -> dict[str, Any]:
    """The last chunk when `stream_options.include_usage` is set: no choices, only usage."""
    return {
        "id": request_id,
        "object": CHAT_CHUNK if kind == "chat" else TEXT_COMPLETION,
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_body(usage),
    }


def timings_extension(timings: Timings, usage: Usage | None = None,
                      tool_report: dict[str, Any] | None = None) -> dict[str, Any]:
    """mlxd's own per-request timings and cache use, beside the OpenAI fields (clients
    ignore it); with `tool_report` (a request with tools), what its calls were:
    `router.tool_calls.late_parser`."""
    timings_body = {k: round(v, 6) for k, v in dataclasses.asdict(timings).items()}
    extension: dict[str, Any] = {"timings": old_names.with_old_keys(timings_body, old_names.TIMINGS)}
    if usage is not None:
        extension["cache"] = old_names.with_old_keys({
            "cached_tokens": usage.cached_tokens, "cold_tokens": usage.cold_tokens, "cold_bytes": usage.cold_bytes,
            "uncached_tokens": usage.prompt_tokens - usage.cached_tokens, **misses_body(usage.misses)},
            old_names.USAGE_CACHE)
    if tool_report is not None:
        extension["tool_calls"] = tool_report
    return extension


def misses_body(misses: CacheMisses | None) -> dict[str, Any]:
    """Why the uncached tokens were uncached (`protocol.cache_misses`): tokens per reason
    (every reason, zeros too; null without a prefix cache) and where a prompt diverged."""
    if misses is None:
        return {"miss_reasons": None, "divergence": None}
    divergence = misses.divergence
    return {"miss_reasons": misses.by_reason(),
            "divergence": None if divergence is None else {
                "token": divergence.token, "message_index": divergence.message_index,
                "role": divergence.role, "field": divergence.field}}


def completion_body(kind: str, request_id: str, model: str, created: int, text: str | None,
                    finish_reason: str, usage: Usage, timings: Timings | None = None,
                    tool_calls: list[dict[str, Any]] | None = None,
                    logprobs: dict[str, Any] | None = None, tool_report: dict[str, Any] | None = None,
                    reasoning: str | None = None) -> dict[str, Any]:
    """A whole non-streamed answer: `chat.completion` or `text_completion`. A chat answer
    that is only tool calls has `content: null`, as OpenAI's."""
    if kind == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if reasoning:
            message["reasoning_content"] = reasoning
        if tool_calls:
            message["tool_calls"] = tool_calls
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }
        object_type = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        object_type = TEXT_COMPLETION
    return {
        "id": request_id,
        "object": object_type,
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage_body(usage),
        **({"mlxd": timings_extension(timings, usage, tool_report)} if timings is not None else {}),
    }


def model_card(model_id: str, created: int, **extra: Any) -> dict[str, Any]:
    """One entry of `GET /v1/models`; `extra` adds mlxd's own fields (state, context_length)."""
    return {"id": model_id, "object": "model", "created": created, "owned_by": "mlxd", **extra}


def progress_chunk(kind: str, request_id: str, model: str, created: int,
                   processed_tokens: int, total_tokens: int) -> dict[str, Any]:
    """mlxd extension chunk (asked for with `"mlxd": {"progress": true}`): prefill
    progress, no choices, so OpenAI clients that don't know it skip it."""
    return {
        "id": request_id,
        "object": CHAT_CHUNK if kind == "chat" else TEXT_COMPLETION,
        "created": created,
        "model": model,
        "choices": [],
        "mlxd": {"progress": {"processed_tokens": processed_tokens, "total_tokens": total_tokens}},
    }
