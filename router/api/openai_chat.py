"""POST /v1/chat/completions: the OpenAI chat body in, OpenAI chat chunks and bodies out."""

from __future__ import annotations

import json
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from protocol.messages import AddRequest
from router.api import openai_answers, schemas
from router.api.dialect_entry import DialectEntry, Endpoint
from router.api.logprobs import with_chat_logprobs
from router.api.openai_common import OPENAI_SAMPLING_NAMES, cache_salt, stream_flags, wants_progress
from router.api.openai_tool_calls import ChatRequest, bind, parse_tools
from router.api.response_format import parse_response_format
from router.api.unknown_fields import OPENAI_CHAT_FIELDS, note_unknown_fields
from router.images import from_url, image_part
from router.profiles import Profile, sent_parameters, with_profile
from router.requests import Dialect, model_name, stream
from router.validation import ParsedRequest, bad, parse_sampling, short
from router.reasoning_request import effort_budget

MESSAGE_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def _content(content: Any, where: str) -> str | list[dict[str, Any]]:
    """Message content (a string or a list of parts) as one string, or, when it holds
    images (`image_url` parts: router/images.py), as text and image parts in order."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad("messages", f"'{where}' must be a string or a list of content parts")
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise bad("messages", f"'{where}[{j}]' must be an object")
        if part.get("type") == "image_url":
            url = part.get("image_url")
            parts.append(image_part(from_url(url.get("url") if isinstance(url, dict) else url, f"{where}[{j}]",
                                             "messages")))
            continue
        if part.get("type") != "text":
            raise bad("messages", f"'{where}[{j}].type' is {part.get('type')!r}: only 'text' and 'image_url' "
                      "content parts are supported")
        if not isinstance(part.get("text"), str):
            raise bad("messages", f"'{where}[{j}].text' must be a string")
        parts.append({"type": "text", "text": part["text"]})
    if all(part["type"] == "text" for part in parts):
        return "\n".join(part["text"] for part in parts)
    return parts


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "'messages' is required and must be a non-empty list")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad("messages", f"'messages[{i}]' must be an object")
        role = message.get("role")
        if role not in MESSAGE_ROLES:
            raise bad("messages", f"'messages[{i}].role' must be one of {', '.join(MESSAGE_ROLES)}, "
                      f"got {short(role)}")
        out.append(_template_message(message, i))
    return out


def _template_message(message: dict[str, Any], i: int) -> dict[str, Any]:
    """The keys of one message that chat templates read (role, content, name, tool_calls,
    tool_call_id, reasoning_content, thinking), type-checked; whatever else a client sends
    stays in the router, so nothing unchecked reaches the worker. `developer` is OpenAI's
    newer name for `system`; chat templates know only `system` (SmolLM2's would render an
    unknown role verbatim, Qwen's would drop its default system prompt beside it)."""
    role = "system" if message["role"] == "developer" else message["role"]
    out: dict[str, Any] = {"role": role,
                           "content": _content(message.get("content"), f"messages[{i}].content")}
    for key in ("name", "tool_call_id", "reasoning_content", "thinking"):
        value = message.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise bad("messages", f"'messages[{i}].{key}' must be a string, got {type(value).__name__}")
        out[key] = value
    tool_calls = message.get("tool_calls")
    if tool_calls:  # [] is no calls (some clients send it)
        if not isinstance(tool_calls, list):
            raise bad("messages", f"'messages[{i}].tool_calls' must be a list of objects")
        out["tool_calls"] = [_history_call(call, f"messages[{i}].tool_calls[{j}]")
                             for j, call in enumerate(tool_calls)]
    return out


def _history_call(call: Any, where: str) -> dict[str, Any]:
    """A call in the history as `{id, type, function: {name, arguments}}`, its arguments
    as JSON text (a client that sent an object gets it serialized the same way each time)."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise bad("messages", f"'{where}' must be {{\"id\": ..., \"type\": \"function\", \"function\": "
                  "{\"name\": ..., \"arguments\": ...}}")
    arguments = function.get("arguments")
    if arguments is None:
        arguments = "{}"
    elif isinstance(arguments, dict):
        arguments = json.dumps(arguments, ensure_ascii=False)
    elif not isinstance(arguments, str):
        raise bad("messages", f"'{where}.function.arguments' must be a string of JSON")
    call_id = call.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise bad("messages", f"'{where}.id' must be a string")
    return {"id": call_id or "", "type": "function", "function": {"name": function["name"], "arguments": arguments}}


def parse(body: dict[str, Any], profile: Profile | None = None) -> ParsedRequest:
    """The chat body -> what to send the worker.

    With the `profile` the request's model name selected, its defaults fill what the body
    left out (see `router.profiles.with_profile`) and its context limit goes to the worker.
    """
    note_unknown_fields("chat", body, OPENAI_CHAT_FIELDS)
    stream, include_usage = stream_flags(body)
    tools, tool_request = parse_tools(body)
    add = AddRequest(
        request_id=f"chatcmpl-{uuid.uuid4().hex}",
        messages=_messages(body),
        tools=tools,
        sampling=with_chat_logprobs(parse_sampling(body), body),
        cache_salt=cache_salt(body),
        want_progress=wants_progress(body),
        constraint=parse_response_format(body),
        reasoning_budget=effort_budget(body.get("reasoning_effort"), "reasoning_effort"),
    )
    parsed = ChatRequest("chat", model_name(body), add, stream, include_usage,
                         sent=sent_parameters(body, OPENAI_SAMPLING_NAMES), tools=tool_request)
    return with_profile(parsed, profile)


DIALECT = Dialect(parse=parse, respond=openai_answers.respond, bind=bind)


async def chat_completions(request: Request) -> Response:
    return await stream(request, DIALECT)


def _probe_prompt(request: Request, body: dict[str, Any], profile: Profile | None) -> AddRequest:
    return parse(body, profile).add


ENTRY = DialectEntry(
    "chat", (Endpoint("/v1/chat/completions", "POST", chat_completions, "OpenAI chat completions, streamed or not",
                      schemas.CHAT),),
    prompt=_probe_prompt, claims=lambda body, headers: "messages" in body)
