"""POST /v1/chat/completions: the OpenAI chat body in, OpenAI chat chunks and bodies out."""

from __future__ import annotations

import uuid
from typing import Any

from protocol.messages import AddRequest
from router.api import openai_answers
from router.api.openai_common import cache_salt, stream_flags, wants_progress
from router.profiles import Profile, apply_profile
from router.requests import Dialect, handle, model_name
from router.validation import ParsedRequest, bad, parse_sampling, short
from starlette.requests import Request
from starlette.responses import Response

MESSAGE_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def _content_text(content: Any, where: str) -> str:
    """Message content (a string or a list of text parts) as one string."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad("messages", f"'{where}' must be a string or a list of content parts")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise bad("messages", f"'{where}[{j}]' must be an object")
        if part.get("type") != "text":
            raise bad("messages", f"'{where}[{j}].type' is {part.get('type')!r}: only 'text' content "
                      "parts are supported")
        if not isinstance(part.get("text"), str):
            raise bad("messages", f"'{where}[{j}].text' must be a string")
        texts.append(part["text"])
    return "\n".join(texts)


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
    stays in the router, so nothing unchecked reaches the worker."""
    out: dict[str, Any] = {"role": message["role"],
                           "content": _content_text(message.get("content"), f"messages[{i}].content")}
    for key in ("name", "tool_call_id", "reasoning_content", "thinking"):
        value = message.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise bad("messages", f"'messages[{i}].{key}' must be a string, got {type(value).__name__}")
        out[key] = value
    tool_calls = message.get("tool_calls")
    if tool_calls is not None:
        if not isinstance(tool_calls, list) or not all(isinstance(c, dict) for c in tool_calls):
            raise bad("messages", f"'messages[{i}].tool_calls' must be a list of objects")
        out["tool_calls"] = tool_calls
    return out


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    choice = body.get("tool_choice")
    if choice is not None and not isinstance(choice, (str, dict)):
        raise bad("tool_choice", "'tool_choice' must be a string or an object")
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad("tools", "'tools' must be a list")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad("tools", f"'tools[{i}]' must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")
    return tools or None


def parse(body: dict[str, Any], profile: Profile | None = None) -> ParsedRequest:
    """The chat body -> what to send the worker.

    With the `profile` the request's model name selected, its defaults fill what the body
    left out (see `router.profiles.apply_profile`) and its context limit goes to the worker.
    """
    if profile is not None:
        body = apply_profile(body, profile, "chat")
    limit = profile.context_limit if profile is not None else None
    stream, include_usage = stream_flags(body)
    add = AddRequest(
        request_id=f"chatcmpl-{uuid.uuid4().hex}",
        messages=_messages(body),
        tools=_tools(body),
        sampling=parse_sampling(body),
        cache_salt=cache_salt(body),
        want_progress=wants_progress(body),
        context_limit=limit,
    )
    return ParsedRequest("chat", model_name(body), add, stream, include_usage, limit)


DIALECT = Dialect(parse=parse, respond=openai_answers.respond)


async def chat_completions(request: Request) -> Response:
    return await handle(request, DIALECT)
