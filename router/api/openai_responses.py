"""POST /v1/responses: the OpenAI Responses body (the only API Codex speaks) into the one
internal request; its answer is `router.api.responses_answers`.

Input items become chat-template messages (`developer` -> system, `function_call` ->
an assistant message's `tool_calls`, `function_call_output` -> a `tool` message), the
flat function tools and those grouped in a `namespace` become chat tools, and `text.format`
becomes the same constraint as chat's `response_format`. Hosted tools (web search, file
search...) and items mlxd cannot render are dropped with a log line, never refused: an
agent that offers them must keep working.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from protocol.errors import RequestError
from protocol.messages import AddRequest, Constraint
from router.api import responses_answers, schemas
from router.api.dialect_entry import DialectEntry, Endpoint
from router.api.openai_common import cache_salt
from router.api.openai_tool_calls import bind, parse_tools
from router.api.response_format import parse_response_format
from router.api.response_store import ResponseStore
from router.api.responses_answers import ResponsesRequest
from router.api.unknown_fields import note_unknown_fields
from router.profiles import Profile, sent_parameters, with_profile
from router.requests import Dialect, model_name, stream
from router.validation import MAX_TOKENS_LIMIT, bad, flag, integer, optional_str, parse_sampling, short
from router.images import ImageRef, from_url, user_content
from router.reasoning_request import responses_budget

logger = logging.getLogger(__name__)

# what the Responses API defines that mlxd reads, or accepts without effect on purpose
# (reasoning, include, metadata, prompt_cache_key...); anything else is logged once
RESPONSES_FIELDS = frozenset({
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text", "max_output_tokens",
    "temperature", "top_p", "stream", "stream_options", "store", "previous_response_id", "include",
    "prompt_cache_key", "prompt_cache_retention", "client_metadata", "metadata", "reasoning", "user",
    "safety_identifier", "service_tier", "truncation", "background", "top_logprobs", "max_tool_calls",
    "cache_salt",
})
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}
FORMATS = ("text", "json_object", "json_schema")
# the Responses fields a profile may default -> their SamplingParams names
SAMPLING_NAMES = {"temperature": "temperature", "top_p": "top_p", "max_output_tokens": "max_tokens"}

_dropped_kinds: set[str] = set()


def _note_dropped(what: str, kind: str) -> None:
    """Log, once per kind, something a client sent that mlxd leaves out of the prompt."""
    if (what, kind) not in _dropped_kinds:
        _dropped_kinds.add((what, kind))
        logger.info("responses: dropping %s of type %r (mlxd cannot serve it; logged once)", what, kind)


# --- input items -> chat-template messages
def _text_parts(content: Any, where: str, *, drop_others: bool = False) -> str | list[dict[str, Any]]:
    """A string, or a list of text parts (`input_text`, `output_text`, `refusal`) joined,
    with `input_image` parts as images (router/images.py: then text and image parts).
    Other parts (files) are refused, or with `drop_others` left out with images too (a
    tool's output keeps its text)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad("input", f"'{where}' must be a string or a list of content parts")
    items: list[str | ImageRef] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        key = TEXT_PARTS.get(kind) if isinstance(kind, str) else None
        if kind == "input_image" and not drop_others:
            items.append(from_url(part.get("image_url"), f"{where}[{j}].image_url", "input"))
            continue
        if key is None:
            if drop_others and isinstance(kind, str):
                _note_dropped("content part", kind)
                continue
            raise bad("input", f"'{where}[{j}].type' is {short(kind)}: only text parts "
                      f"({', '.join(TEXT_PARTS)}) and input_image are supported")
        text = part.get(key)
        if not isinstance(text, str):
            raise bad("input", f"'{where}[{j}].{key}' must be a string")
        items.append(text)
    return user_content(items)


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ROLES:
        raise bad("input", f"'{where}.role' must be one of {', '.join(ROLES)}, got {short(role)}")
    return {"role": ROLES[role], "content": _text_parts(item.get("content"), f"{where}.content")}


def _call(item: dict[str, Any], where: str) -> dict[str, Any]:
    """A `function_call` item as a chat `tool_calls` entry, its arguments as JSON text."""
    name, call_id, arguments = item.get("name"), item.get("call_id"), item.get("arguments")
    if not isinstance(name, str) or not name:
        raise bad("input", f"'{where}.name' must be the called function's name")
    if not isinstance(call_id, str) or not call_id:
        raise bad("input", f"'{where}.call_id' must be a string")
    if arguments is None:
        arguments = "{}"
    elif isinstance(arguments, dict):
        arguments = json.dumps(arguments, ensure_ascii=False)
    elif not isinstance(arguments, str):
        raise bad("input", f"'{where}.arguments' must be a string of JSON")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _call_output(item: dict[str, Any], where: str) -> dict[str, Any]:
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        raise bad("input", f"'{where}.call_id' must be a string")
    return {"role": "tool", "tool_call_id": call_id,
            "content": _text_parts(item.get("output"), f"{where}.output", drop_others=True)}


def input_messages(value: Any, param: str = "input") -> list[dict[str, Any]]:
    """`input` (a string, or a list of items) as chat-template messages. The calls of one
    turn join the assistant message before them, as chat templates expect them."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise bad(param, f"'{param}' must be a string or a list of input items")
    messages: list[dict[str, Any]] = []
    reasoning = ""  # a reasoning item's text, for the assistant turn it came before
    for i, item in enumerate(value):
        where = f"{param}[{i}]"
        if not isinstance(item, dict):
            raise bad(param, f"'{where}' must be an object")
        kind = item.get("type", "message" if "role" in item else None)  # {role, content} needs no type
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            call = _call(item, where)
            if messages and messages[-1]["role"] == "assistant" and not reasoning:
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(_call_output(item, where))
        elif kind == "reasoning":
            reasoning += _reasoning_text(item, where)
            continue
        else:
            _note_dropped("input item", str(kind))
        if reasoning and messages and messages[-1]["role"] == "assistant":
            messages[-1]["reasoning_content"] = reasoning
        reasoning = ""
    return messages


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    """A `reasoning` item's text (its `reasoning_text` parts, as mlxd's answers carry it):
    the template decides whether the turn after it shows it again. Another model's
    reasoning is often only `encrypted_content` and a summary: nothing to render."""
    content = item.get("content")
    if content is None:
        return ""
    if not isinstance(content, list):
        raise bad("input", f"'{where}.content' must be a list of reasoning_text parts")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("text"), str):
            raise bad("input", f"'{where}.content[{j}]' must be {{\"type\": \"reasoning_text\", \"text\": ...}}")
        texts.append(part["text"])
    return "".join(texts)


# --- tools
def _function(tool: dict[str, Any], where: str) -> dict[str, Any]:
    """A flat Responses function tool as chat's `{type, function: {name, ...}}`."""
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise bad("tools", f"'{where}.name' must be a non-empty string")
    function: dict[str, Any] = {"name": name}
    for key, kind in (("description", str), ("parameters", dict)):
        value = tool.get(key)
        if value is None:
            continue
        if not isinstance(value, kind):
            raise bad("tools", f"'{where}.{key}' must be a {'string' if kind is str else 'JSON schema object'}")
        function[key] = value
    return {"type": "function", "function": function}


def _tools(value: Any) -> tuple[list[dict[str, Any]], dict[str, str], list[dict[str, Any]]]:
    """The chat tools, the namespace of each namespaced function, and the function tools
    in the Responses shape (what a Response repeats). A namespace's functions are offered
    by their own names, and a call to one names its namespace."""
    if value is None:
        return [], {}, []
    if not isinstance(value, list):
        raise bad("tools", "'tools' must be a list")
    chat_tools: list[dict[str, Any]] = []
    namespaces: dict[str, str] = {}
    echoed: list[dict[str, Any]] = []
    for i, tool in enumerate(value):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind == "function":
            assert isinstance(tool, dict)
            _offer(chat_tools, _function(tool, f"tools[{i}]"))
            echoed.append(tool)
        elif kind == "namespace":
            assert isinstance(tool, dict)
            namespace, members = tool.get("name"), tool.get("tools")
            if not isinstance(namespace, str) or not isinstance(members, list):
                raise bad("tools", f"'tools[{i}]' (a namespace) must have a 'name' and a list of 'tools'")
            for j, member in enumerate(members):
                if not isinstance(member, dict) or member.get("type") != "function":
                    _note_dropped("namespace tool", str(member.get("type") if isinstance(member, dict) else member))
                    continue
                if _offer(chat_tools, _function(member, f"tools[{i}].tools[{j}]")):
                    namespaces[member["name"]] = namespace
            echoed.append(tool)
        elif isinstance(kind, str):
            _note_dropped("tool", kind)  # hosted tools (web_search, file_search, ...) and custom ones
        else:
            raise bad("tools", f"'tools[{i}]' must be an object with a 'type'")
    return chat_tools, namespaces, echoed


def _offer(chat_tools: list[dict[str, Any]], tool: dict[str, Any]) -> bool:
    """Add `tool` unless its name is taken (by another namespace's function, say): the
    model calls functions by name alone, so the first one offered keeps it."""
    name = tool["function"]["name"]
    if any(offered["function"]["name"] == name for offered in chat_tools):
        logger.info("responses: a second tool named %r is dropped; the first one offered keeps the name", name)
        return False
    chat_tools.append(tool)
    return True


def _tool_choice(value: Any) -> Any:
    """`tool_choice` in the form chat's parser reads (it reads the flat function form
    too). `allowed_tools` keeps its mode (the restriction is not enforced); a hosted
    tool's choice is "auto", as that tool is not offered."""
    if isinstance(value, dict) and value.get("type") not in (None, "function"):
        if value.get("type") == "allowed_tools" and value.get("mode") in ("auto", "required"):
            return value["mode"]
        _note_dropped("tool_choice", str(value.get("type")))
        return "auto"
    return value


# --- text.format -> the constraint
def _text_format(body: dict[str, Any]) -> tuple[Constraint | None, dict[str, Any]]:
    """The constraint `text.format` asks for, and the `text` a Response repeats back."""
    text = body.get("text")
    if text is None:
        return None, {"format": {"type": "text"}}
    if not isinstance(text, dict):
        raise bad("text", "'text' must be an object, e.g. {\"format\": {\"type\": \"json_object\"}}")
    fmt = text.get("format")
    if fmt is None:
        return None, {**text, "format": {"type": "text"}}
    if not isinstance(fmt, dict) or fmt.get("type") not in FORMATS:
        raise bad("text", f"'text.format' must be an object whose 'type' is one of {', '.join(FORMATS)}, "
                  f"got {short(fmt)}")
    if fmt["type"] == "json_schema":
        spec = {key: fmt[key] for key in ("name", "schema", "strict") if key in fmt}
        response_format: dict[str, Any] = {"type": "json_schema", "json_schema": spec}
    else:
        response_format = {"type": fmt["type"]}
    try:
        constraint = parse_response_format({"response_format": response_format})
    except RequestError as exc:  # the same checks as chat's; the message names this API's field
        message = exc.message.replace("response_format.json_schema", "text.format").replace("response_format",
                                                                                             "text.format")
        raise bad("text", message) from None
    return constraint, text


# --- the request
def _previous(body: dict[str, Any], store: ResponseStore) -> list[dict[str, Any]]:
    """The stored conversation `previous_response_id` continues ([] without one)."""
    previous_id = optional_str(body, "previous_response_id")
    if previous_id is None:
        return []
    stored = store.get(previous_id)
    if stored is None:
        raise RequestError(f"Previous response with id {previous_id!r} not found (mlxd keeps the last "
                           f"{store.capacity} responses created with store: true, until it restarts).",
                           status=400, param="previous_response_id", code="previous_response_not_found")
    return [dict(message) for message in stored.messages]


def parse(body: dict[str, Any], profile: Profile | None = None, *, store: ResponseStore) -> ResponsesRequest:
    """The Responses body -> what to send the worker, and what its Response repeats.

    The profile fills what the body left out, as for chat; `store` holds the
    conversations `previous_response_id` may continue.
    """
    note_unknown_fields("responses", body, RESPONSES_FIELDS)
    keep = body.get("store")
    keep = True if keep is None else flag(body, "store")
    stream = flag(body, "stream")
    max_output_tokens = integer(body, "max_output_tokens", 1, MAX_TOKENS_LIMIT)
    instructions = body.get("instructions")
    first = [{"role": "system", "content": instructions}] if isinstance(instructions, str) and instructions else []
    if instructions is not None and not isinstance(instructions, str):
        first = input_messages(instructions, "instructions")
    conversation = [*_previous(body, store), *input_messages(body.get("input"))]
    if not conversation:
        raise bad("input", "'input' is required: a string or a non-empty list of input items")
    prompt_cache_key = optional_str(body, "prompt_cache_key")
    if prompt_cache_key is not None:  # mlxd's cache keys on the prompt's tokens; a key cannot help it
        logger.debug("responses: prompt_cache_key %r (a hint; the prefix cache needs none)", prompt_cache_key)
    # the chat fields that share a meaning, so the chat checks apply as for chat
    chat_body: dict[str, Any] = {"max_tokens": max_output_tokens, "temperature": body.get("temperature"),
                                 "top_p": body.get("top_p")}
    chat_tools, namespaces, echoed_tools = _tools(body.get("tools"))
    tools, tool_request = parse_tools({"tools": chat_tools, "tool_choice": _tool_choice(body.get("tool_choice")),
                                       "parallel_tool_calls": body.get("parallel_tool_calls")})
    constraint, text = _text_format(body)
    response_id = f"resp_{uuid.uuid4().hex}"
    add = AddRequest(request_id=response_id, messages=[*first, *conversation], tools=tools,
                     sampling=parse_sampling(chat_body), cache_salt=cache_salt(body), constraint=constraint,
                     reasoning_budget=responses_budget(body))
    parsed = with_profile(ResponsesRequest(
        "responses", model_name(body), add, stream, True, sent=sent_parameters(body, SAMPLING_NAMES),
        tools=tool_request, response_id=response_id, conversation=tuple(conversation), store=keep,
        namespaces=namespaces), profile)
    sampling = parsed.add.sampling
    echo = {
        "instructions": instructions, "max_output_tokens": max_output_tokens, "metadata": body.get("metadata") or {},
        "parallel_tool_calls": tool_request.parallel if tool_request is not None else body.get(
            "parallel_tool_calls") is not False,
        "previous_response_id": body.get("previous_response_id"), "prompt_cache_key": prompt_cache_key,
        "store": keep, "temperature": sampling.temperature, "top_p": sampling.top_p, "text": text,
        "tool_choice": body.get("tool_choice") or "auto", "tools": echoed_tools, "truncation": "disabled",
        "user": body.get("user"),
    }
    return dataclasses.replace(parsed, echo=echo)


def store_of(request: Request) -> ResponseStore:
    """The app's response store, made with its first Responses request (an app that
    never serves one holds none)."""
    state = request.app.state
    if not hasattr(state, "response_store"):
        state.response_store = ResponseStore()
    return state.response_store


async def responses(request: Request) -> Response:
    store = store_of(request)
    dialect = Dialect(parse=partial(parse, store=store), respond=partial(responses_answers.respond, store=store),
                      bind=bind)
    return await stream(request, dialect)


def _probe_prompt(request: Request, body: dict[str, Any], profile: Profile | None) -> AddRequest:
    return parse(body, profile, store=store_of(request)).add


ENTRY = DialectEntry(
    "responses", (Endpoint("/v1/responses", "POST", responses, "OpenAI Responses", schemas.RESPONSES),),
    prompt=_probe_prompt, claims=lambda body, headers: "input" in body)
