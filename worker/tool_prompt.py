"""Tools in the prompt: which tool-call dialect a chat template speaks, and the messages it
is rendered with, so that a later turn sees its own calls and their results.

A template that renders `tools` itself in a format we know gets them through
`apply_chat_template(tools=...)`; any other template gets mlxd's fallback dialect, written
by mlxd into the system prompt (`FALLBACK_INSTRUCTIONS`), with calls and results in the
history rendered as text in the same markup. Everything here is a pure function of its
input, since the prefix cache needs the same request to give the same tokens.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import string
from typing import Any

from protocol.tool_dialects import CALL_CLOSE, CALL_OPEN, HERMES, LLAMA3_JSON, MISTRAL, MLXD, RESULT_CLOSE, RESULT_OPEN

_RENDERS_TOOLS = re.compile(r"\btools\b")

FALLBACK_INSTRUCTIONS = (
    "# Tools\n\n"
    "You can call functions to help answer the user. Each function is described below as a "
    "JSON object (name, description, parameters as a JSON schema), one per line:\n"
    "<tools>\n{tools}\n</tools>\n\n"
    "To call a function, answer with one block like this per call and write nothing after the blocks:\n"
    f"{CALL_OPEN}\n"
    '{{"name": "<function name>", "arguments": {{<the arguments as a JSON object>}}}}\n'
    f"{CALL_CLOSE}\n\n"
    f"Each result comes back to you in a {RESULT_OPEN}{RESULT_CLOSE} block. "
    "When no function is needed, answer normally."
)


@functools.lru_cache(maxsize=8)
def detect_tool_dialect(template: str | None) -> str:
    """The dialect of a chat template: one that renders `tools` and shows a known call
    markup speaks that markup's dialect; any other gets mlxd's fallback, because we could
    not parse what a template of unknown format teaches the model to write."""
    if not template or not _RENDERS_TOOLS.search(template):
        return MLXD
    if CALL_OPEN in template:
        return HERMES
    if "[TOOL_CALLS]" in template:
        return MISTRAL
    if "<|python_tag|>" in template or "<|start_header_id|>" in template:
        return LLAMA3_JSON
    return MLXD


def template_source(tokenizer: Any) -> str | None:
    """The template `apply_chat_template` uses when tools are given (HF tokenizers may hold
    several, by name)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        return template.get("tool_use") or template.get("default")
    return template


def arguments_object(arguments: Any) -> Any:
    """A call's arguments as the object templates expect (`arguments | tojson` would quote
    OpenAI's JSON string a second time); text that is not a JSON object stays as it is."""
    if not isinstance(arguments, str):
        return arguments
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments


_MISTRAL_ID_CHARS = string.ascii_letters + string.digits


def _mistral_call_id(call_id: str) -> str:
    """Mistral's templates refuse ids that are not 9 alphanumerics: map any other id to
    such one, the same way every time, so a call and its result still match."""
    if len(call_id) == 9 and call_id.isalnum():
        return call_id
    digest = hashlib.sha256(call_id.encode()).digest()
    return "".join(_MISTRAL_ID_CHARS[b % len(_MISTRAL_ID_CHARS)] for b in digest[:9])


def template_messages(messages: list[dict[str, Any]], dialect: str) -> list[dict[str, Any]]:
    """The history for a template that renders tools itself: each call as
    `{id, type, function: {name, arguments: object}}`."""
    out = []
    for message in messages:
        message = dict(message)
        if message.get("tool_calls"):
            message["tool_calls"] = [_template_call(call, dialect) for call in message["tool_calls"]]
        if dialect == MISTRAL and isinstance(message.get("tool_call_id"), str):
            message["tool_call_id"] = _mistral_call_id(message["tool_call_id"])
        out.append(message)
    return out


def _template_call(call: dict[str, Any], dialect: str) -> dict[str, Any]:
    function = call.get("function") or {}
    call_id = call.get("id") or ""
    return {
        "id": _mistral_call_id(call_id) if dialect == MISTRAL else call_id,
        "type": "function",
        "function": {"name": function.get("name", ""), "arguments": arguments_object(function.get("arguments", {}))},
    }


def fallback_call_text(call: dict[str, Any]) -> str:
    """One call in mlxd's fallback markup, as the model is told to write it."""
    function = call.get("function") or {}
    body = {"name": function.get("name", ""), "arguments": arguments_object(function.get("arguments", {}))}
    return f"{CALL_OPEN}\n{json.dumps(body, ensure_ascii=False)}\n{CALL_CLOSE}"


def fallback_tools_text(tools: list[dict[str, Any]]) -> str:
    """The system-prompt block that teaches a model without a tool template the fallback
    dialect and lists the tools."""
    lines = [json.dumps(tool.get("function", tool), ensure_ascii=False) for tool in tools]
    return FALLBACK_INSTRUCTIONS.format(tools="\n".join(lines))


def fallback_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                      tools_first: bool = False) -> list[dict[str, Any]]:
    """The conversation for a template without tool support: the tools block joined to
    the leading system message (after it, or before it with `tools_first`, so that the
    tools are a prefix sessions with other system texts share), or a system message made
    for it; assistant calls and tool results as text in the fallback markup (consecutive
    results in one user turn, as Hermes templates do), so that a plain template renders
    them like any other turn."""
    out: list[dict[str, Any]] = []
    previous_role = None
    for message in messages:
        role = message.get("role")
        if role in ("tool", "function"):
            result = f"{RESULT_OPEN}\n{message.get('content', '')}\n{RESULT_CLOSE}"
            if previous_role in ("tool", "function"):
                out[-1]["content"] += "\n" + result
            else:
                out.append({"role": "user", "content": result})
        else:
            text = {key: value for key, value in message.items() if key not in ("tool_calls", "tool_call_id")}
            calls = [fallback_call_text(call) for call in message.get("tool_calls") or ()]
            if calls:
                text["content"] = "\n".join([text["content"], *calls] if text.get("content") else calls)
            out.append(text)
        previous_role = role
    if tools:
        block = fallback_tools_text(tools)
        if out and out[0].get("role") in ("system", "developer"):
            system = out[0].get("content")
            joined = (block, system) if tools_first else (system, block)
            out[0] = {**out[0], "content": "\n\n".join(joined) if system else block}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out
