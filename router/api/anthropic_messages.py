"""POST /v1/messages: the Anthropic Messages body in, as the one internal chat request.

Anthropic's content blocks become the chat-template messages the OpenAI chat API builds
(role, content, tool_calls, tool_call_id): `tool_use` is an assistant's call, `tool_result`
a `tool` message; the top-level system text is the leading system message and the
`role: "system"` entries Claude Code puts inside `messages` stay in place. A request that ends with an assistant message
is a prefill the answer continues. The answer is `router.api.anthropic_answers`.

Rendering is deterministic and shape-blind: a string and the same text as text blocks give
the same prompt, and `cache_control` never changes it, so resent history keeps hitting the
prefix cache. `cache_control` breakpoints travel beside the prompt, as points of the internal
request (`router.api.anthropic_cache_control`).
"""

from __future__ import annotations

import functools
import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from protocol.cache_breakpoints import CacheBreakpoint
from protocol.messages import AddRequest
from router.api import anthropic_answers
from router.api.anthropic_cache_control import HEAD, WHOLE, BreakpointReader, Mark, breakpoints, text_marks
from router.api.anthropic_errors import answer_error
from router.api.billing_header import without_billing_lines
from router.api.openai_tool_calls import ChatRequest, bind
from router.api.unknown_fields import note_unknown_fields
from router.profiles import Profile, sent_parameters, with_profile
from router.tool_calls import AUTO, FUNCTION, NONE, REQUIRED
from router.tool_calls.offer import OfferedTool, ToolChoice, offer_tools
from router.requests import Dialect, model_name, stream
from router.reasoning_request import anthropic_budget
from router.images import ImageRef, anthropic_image, content_chars, joined_turns, user_content
from router.validation import (
    MAX_STOP_STRINGS,
    MAX_TOKENS_LIMIT,
    ParsedRequest,
    bad,
    flag,
    integer,
    parse_sampling,
    short,
)

logger = logging.getLogger(__name__)

ANTHROPIC_MESSAGES_FIELDS = frozenset({
    "model", "messages", "system", "max_tokens", "stop_sequences", "temperature", "top_p", "top_k", "stream",
    "tools", "tool_choice", "metadata", "thinking", "cache_salt", "cache_control",
})
# the Messages fields a profile may default -> their SamplingParams names
SAMPLING_NAMES = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "stop_sequences": "stop",
                  "max_tokens": "max_tokens"}
IMAGE_TEXT = "[image]"  # what a text-only model sees where the client sent an image
DROPPED_SILENTLY = frozenset({"thinking", "redacted_thinking"})  # reasoning: a user turn's, or opaque

_logged_types: set[str] = set()


@dataclass(frozen=True)
class MessagesRequest(ChatRequest):
    """A chat request that answers in Anthropic's shape; `prefill` is the assistant text the
    answer continues (not repeated in the answer, as Anthropic does)."""

    prefill: str = ""


def _note_dropped(block_type: Any, where: str) -> None:
    """One log line per block type mlxd does not render (clients resend history every
    turn: a line per request would drown the log); an image is rendered as IMAGE_TEXT."""
    key = f"{where}:{block_type}"
    if key not in _logged_types:
        _logged_types.add(key)
        if block_type == "image":
            logger.info("messages: an image in %s is rendered as %r: this model reads text only (logged once)",
                        where, IMAGE_TEXT)
        else:
            logger.info("messages: dropping %s content block of type %r (not rendered; logged once)", where,
                        block_type)


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """Content as a list of blocks: a string is one text block, so both shapes render the same."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if content is None:
        return []
    if not isinstance(content, list):
        raise bad("messages", f"'{where}' must be a string or a list of content blocks")
    for j, block in enumerate(content):
        if not isinstance(block, dict):
            raise bad("messages", f"'{where}[{j}]' must be an object")
    return content


def _block_text(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise bad("messages", f"'{where}.text' must be a string")
    return text


def _system_parts(content: Any, where: str, reader: BreakpointReader) -> list[tuple[str | None, int | None]]:
    """Per block of system content, its text (text blocks; an image becomes IMAGE_TEXT;
    None: any other block, dropped) and the TTL of its cache breakpoint (None: none)."""
    parts: list[tuple[str | None, int | None]] = []
    for j, block in enumerate(_blocks(content, where)):
        kind, text = block.get("type"), None
        if kind == "text":
            text = _block_text(block, f"{where}[{j}]")
        elif kind == "image":
            _note_dropped("image", where)
            text = IMAGE_TEXT
        else:
            _note_dropped(kind, "system")
        parts.append((text, reader.ttl_s(block, f"{where}[{j}]")))
    return parts


def _tool_result_text(content: Any, where: str) -> str:
    """A tool result's content as one text: text blocks as they are, images as IMAGE_TEXT,
    any other block (Claude Code's `tool_reference`) as its JSON, so nothing the tool
    returned is lost and the same result always reads the same."""
    parts = []
    for j, block in enumerate(_blocks(content, where)):
        kind = block.get("type")
        if kind == "text":
            parts.append(_block_text(block, f"{where}[{j}]"))
        elif kind == "image":
            _note_dropped("image", "tool_result")
            parts.append(IMAGE_TEXT)
        else:
            shown = {key: value for key, value in block.items() if key != "cache_control"}
            parts.append(json.dumps(shown, ensure_ascii=False, sort_keys=True))
    return "\n".join(parts)


def _user_messages(content: Any, where: str,
                   reader: BreakpointReader) -> tuple[list[dict[str, Any]], list[Mark]]:
    """One user turn: a `tool` message per tool_result (first: the calls' results answer the
    previous turn), then the user's text, if any; and its cache breakpoints as marks on
    those messages: a tool result's on its whole message, any other's on the user text up
    to its block (or, before any text, on the last result)."""
    results: list[dict[str, Any]] = []
    texts: list[str | ImageRef] = []
    result_marks: list[Mark] = []
    text_points: list[tuple[int, int]] = []  # (characters of the user text up to the block, TTL)
    for j, block in enumerate(_blocks(content, where)):
        kind, spot = block.get("type"), f"{where}[{j}]"
        if kind == "text":
            texts.append(_block_text(block, spot))
        elif kind == "image":
            texts.append(anthropic_image(block, spot))
        elif kind == "tool_result":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str):
                raise bad("messages", f"'{spot}.tool_use_id' must be a string")
            text = _tool_result_text(block.get("content"), f"{spot}.content")
            if block.get("is_error") is True:
                text = f"Error: {text}"
            results.append({"role": "tool", "tool_call_id": call_id, "content": text})
        elif kind not in DROPPED_SILENTLY:
            _note_dropped(kind, "user")
        ttl = reader.ttl_s(block, spot)
        if ttl is None:
            continue
        if kind != "tool_result" and texts:
            text_points.append((content_chars(texts), ttl))
        elif results:
            result_marks.append((len(results) - 1, WHOLE, ttl))
    marks = result_marks + [(len(results), chars, ttl) for chars, ttl in text_points]  # the text follows the results
    if texts or not results:
        results.append({"role": "user", "content": user_content(texts)})
    return results, marks


def _assistant_message(content: Any, where: str) -> dict[str, Any]:
    """One assistant turn: its text, its `thinking` blocks as `reasoning_content`, and its
    `tool_use` blocks as chat tool calls whose arguments are the input's JSON text
    (serialized the same way every time)."""
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(_blocks(content, where)):
        kind, spot = block.get("type"), f"{where}[{j}]"
        if kind == "text":
            texts.append(_block_text(block, spot))
        elif kind == "tool_use":
            name, call_id, arguments = block.get("name"), block.get("id"), block.get("input")
            if not isinstance(name, str) or not name:
                raise bad("messages", f"'{spot}.name' must be a non-empty string")
            if call_id is not None and not isinstance(call_id, str):
                raise bad("messages", f"'{spot}.id' must be a string")
            if arguments is None:
                arguments = {}
            calls.append({"id": call_id or "", "type": "function",
                          "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}})
        elif kind == "thinking":
            thought = block.get("thinking")
            if not isinstance(thought, str):
                raise bad("messages", f"'{spot}.thinking' must be a string")
            thoughts.append(thought)
        elif kind in DROPPED_SILENTLY:
            continue
        else:
            _note_dropped(kind, "assistant")
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if thoughts:  # the template decides whether a past turn's reasoning is shown again
        message["reasoning_content"] = "\n\n".join(thoughts)
    if calls:
        message["tool_calls"] = calls
    return message


def chat_messages(body: dict[str, Any], normalize_billing_header: bool = True) -> tuple[list[dict[str, Any]], str]:
    """`system` and `messages` -> the chat-template messages, and the assistant prefill
    ("" if the last message is not an assistant's); see `read_messages`."""
    messages, prefill, _ = read_messages(body, normalize_billing_header)
    return messages, prefill


def read_messages(body: dict[str, Any], normalize_billing_header: bool = True,
                  reader: BreakpointReader | None = None) -> tuple[list[dict[str, Any]], str, list[CacheBreakpoint]]:
    """`system` and `messages` -> the chat-template messages, the assistant prefill ("" if
    the last message is not an assistant's), and the cache breakpoints on them (counted by
    `reader`).

    The top-level `system` (without Claude Code's billing line unless
    `normalize_billing_header` is off) is the leading system message; each `role: "system"`
    entry of `messages` stays where it is, so a note Claude Code adds late in a session
    leaves the cached prefix before it alone (the worker moves them to the start for a
    template that takes a system message only there). Consecutive user texts are merged
    into one turn, as Anthropic does (and templates that require alternating roles need).
    A top-level `cache_control` (Anthropic's automatic caching) is a breakpoint on the last
    message."""
    reader = reader or BreakpointReader()
    parts = _system_parts(body.get("system"), "system", reader)
    if normalize_billing_header:
        parts = [(next(iter(without_billing_lines([text])), None) if text is not None else None, ttl)
                 for text, ttl in parts]
    system, system_marks = text_marks(parts)
    marks: list[Mark] = [(HEAD, chars, ttl) for chars, ttl in system_marks]
    leading = "\n".join(system)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "'messages' is required and must be a non-empty list")
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}].content"
        role = message.get("role") if isinstance(message, dict) else None
        if role == "system":
            texts, in_text = text_marks(_system_parts(message.get("content"), where, reader))
            if texts:
                turns.append({"role": "system", "content": "\n".join(texts)})
                marks += [(len(turns) - 1, chars, ttl) for chars, ttl in in_text]
        elif role == "user":
            out, in_turns = _user_messages(message.get("content"), where, reader)
            placed = []  # per message of `out`: (its turn, where its text starts in that turn)
            for turn in out:
                if turn["role"] == "user" and turns and turns[-1]["role"] == "user":
                    turns[-1]["content"], start = joined_turns(turns[-1]["content"], turn["content"])
                    placed.append((len(turns) - 1, start))
                else:
                    turns.append(turn)
                    placed.append((len(turns) - 1, 0))
            marks += [(placed[k][0], chars if WHOLE in (chars, placed[k][1]) else placed[k][1] + chars, ttl)
                      for k, chars, ttl in in_turns]
        elif role == "assistant":
            turns.append(_assistant_message(message.get("content"), where))
            for j, block in enumerate(_blocks(message.get("content"), where)):
                ttl = reader.ttl_s(block, f"{where}[{j}]")
                if ttl is not None:
                    marks.append((len(turns) - 1, WHOLE, ttl))
        else:
            raise bad("messages", f"'messages[{i}].role' must be \"user\", \"assistant\" or \"system\", "
                      f"got {short(role)}")
    prefill = ""
    if turns and turns[-1]["role"] == "assistant":
        last = turns[-1]
        if last.get("tool_calls") or not last["content"]:
            turns.pop()  # nothing to continue: answer after the history as it is
        else:
            prefill = last["content"]
    if not any(turn["role"] != "system" for turn in turns):
        raise bad("messages", "'messages' must hold at least one user message")
    automatic = reader.ttl_s(body, "")
    if automatic is not None:
        marks.append((len(turns) - 1, WHOLE, automatic))
    head = [{"role": "system", "content": leading}] if leading else []
    return head + turns, prefill, breakpoints(marks, head + turns, bool(head))


def _tools(body: dict[str, Any], reader: BreakpointReader | None = None,
           points: list[CacheBreakpoint] | None = None) -> tuple[list[OfferedTool], ToolChoice]:
    """`tools` and `tool_choice`, read in Anthropic's spelling (errors name its fields):
    the same rendering, parser and forcing grammar then serve every API. Server tools (web
    search, code execution: a `type` and no `input_schema`) run at Anthropic, not here:
    dropped. A tool's cache breakpoint goes to `points`, after the tools kept up to it."""
    reader = reader or BreakpointReader()
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad("tools", "'tools' must be a list")
    offered: list[OfferedTool] = []
    for i, tool in enumerate(tools or []):
        if not isinstance(tool, dict):
            raise bad("tools", f"'tools[{i}]' must be an object")
        server_tool = "input_schema" not in tool and tool.get("type") not in (None, "custom")
        ttl = reader.ttl_s(tool, f"tools[{i}]", "tools")
        if ttl is not None and points is not None and len(offered) + (not server_tool):
            points.append(CacheBreakpoint(ttl, num_tools=len(offered) + (not server_tool)))
        if server_tool:
            _note_dropped(tool.get("type"), "tools")
            continue
        name, description, schema = tool.get("name"), tool.get("description"), tool.get("input_schema")
        if not isinstance(name, str) or not name:
            raise bad("tools", f"'tools[{i}].name' must be a non-empty string, got {short(name)}")
        if description is not None and not isinstance(description, str):
            raise bad("tools", f"'tools[{i}].description' must be a string")
        if schema is not None and not isinstance(schema, dict):
            raise bad("tools", f"'tools[{i}].input_schema' must be a JSON schema object")
        offered.append(OfferedTool(name, description, schema))
    return offered, _tool_choice(body.get("tool_choice"))


def _tool_choice(choice: Any) -> ToolChoice:
    if choice is None:
        return ToolChoice()
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise bad("tool_choice", "'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"none\"} or "
                  f"{{\"type\": \"tool\", \"name\": ...}}, got {short(choice)}")
    kind, parallel = choice["type"], choice.get("disable_parallel_tool_use") is not True
    if kind == "tool":
        if not isinstance(choice.get("name"), str) or not choice["name"]:
            raise bad("tool_choice", "'tool_choice.name' must name a tool")
        return ToolChoice(FUNCTION, choice["name"], parallel, short(choice))
    return ToolChoice({"auto": AUTO, "any": REQUIRED, "none": NONE}[kind], None, parallel, short(choice))


def _sampling_fields(body: dict[str, Any]) -> dict[str, Any]:
    """Anthropic's sampling fields under the names `parse_sampling` reads. `max_tokens` is
    required, as Anthropic has it; one larger than the model's output cap is clamped by the
    worker, never refused."""
    if body.get("max_tokens") is None:
        raise bad("max_tokens", "max_tokens: Field required")
    integer(body, "max_tokens", 1, MAX_TOKENS_LIMIT)
    stops = body.get("stop_sequences")
    if stops is not None and (not isinstance(stops, list) or not all(isinstance(s, str) for s in stops)):
        raise bad("stop_sequences", "'stop_sequences' must be a list of strings")
    if stops is not None and len(stops) > MAX_STOP_STRINGS:
        raise bad("stop_sequences", f"'stop_sequences' may hold at most {MAX_STOP_STRINGS} strings, got {len(stops)}")
    return {key: body.get(key) for key in ("max_tokens", "temperature", "top_p", "top_k")} | {"stop": stops}


def parse(body: dict[str, Any], profile: Profile | None = None, *,
          normalize_billing_header: bool = True) -> ParsedRequest:
    """The Messages body -> what to send the worker. `thinking` sets a reasoning model's
    budget (router.reasoning_request); `metadata` is accepted and has no effect."""
    note_unknown_fields("messages", body, ANTHROPIC_MESSAGES_FIELDS)
    stream = flag(body, "stream")
    reader, points = BreakpointReader(), []
    messages, prefill, message_points = read_messages(body, normalize_billing_header, reader)
    offered, choice = _tools(body, reader, points)
    tools, tool_request = offer_tools(offered, choice)
    reader.check()
    cache_salt = body.get("cache_salt")
    if cache_salt is not None and not isinstance(cache_salt, str):
        raise bad("cache_salt", "'cache_salt' must be a string")
    add = AddRequest(
        request_id=f"msg_{uuid.uuid4().hex[:24]}",
        messages=messages,
        tools=tools,
        sampling=parse_sampling(_sampling_fields(body)),
        cache_salt=cache_salt,
        continue_final_message=bool(prefill),
        # Anthropic's cache order: tools, system, messages (tools dropped with tool_choice none: no point)
        cache_breakpoints=(points if tools else []) + message_points,
        reasoning_budget=anthropic_budget(body),
    )
    parsed = MessagesRequest("chat", model_name(body), add, stream, False, sent=sent_parameters(body, SAMPLING_NAMES),
                             tools=tool_request, prefill=prefill)
    return with_profile(parsed, profile)


async def messages(request: Request) -> Response:
    """The route: every failure before the answer starts is an Anthropic error response."""
    config = request.app.state.config
    dialect = Dialect(parse=functools.partial(parse, normalize_billing_header=config.normalize_billing_header),
                      respond=anthropic_answers.respond, bind=bind)
    try:
        return await stream(request, dialect)
    except Exception as exc:  # noqa: BLE001  (any failure answers in Anthropic's shape; answer_error logs bugs)
        return answer_error(exc)
