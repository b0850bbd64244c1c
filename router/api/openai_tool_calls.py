"""Tool calls on the OpenAI chat API: the body's `tools`, `tool_choice` and
`parallel_tool_calls`, and the answer's text run through the model's tool-call parser
(`router.tool_calls`) into OpenAI's `tool_calls`, streamed or whole.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from dataclasses import dataclass
from typing import Any

from protocol.constraints import constraint_problem
from protocol.messages import Constraint, Ready
from protocol.tool_dialects import MLXD
from router.api.openai_format import message_tool_calls, tool_call_arguments_delta, tool_call_start_delta
from router.tool_calls import (
    AUTO,
    FUNCTION,
    NONE,
    REQUIRED,
    ArgumentsDelta,
    CallStart,
    Event,
    TextDelta,
    ToolCallParser,
    ToolRequest,
    dialect_named,
    forced_call_grammar,
    gather,
    make_parser,
)
from router.tool_calls.late_parser import LateParser
from router.tool_calls.repeats import last_results
from router.tool_calls.lazy_grammar import lazy_call_constraint
from router.tool_calls.offer import OfferedTool, ToolChoice, offer_tools
from router.validation import ParsedRequest, bad, flag, short

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChatRequest(ParsedRequest):
    """A chat request with what its answer needs to find tool calls: the offered tools
    (None: no tools, or `tool_choice: "none"`), and the dialect of the model's worker
    (set once the worker is known, by `bind`)."""

    tools: ToolRequest | None = None
    tool_dialect: str = MLXD


def parse_tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, ToolRequest | None]:
    """`tools`, `tool_choice` and `parallel_tool_calls` of a chat body -> the tools as the
    worker renders them and what the answer's parser and grammar need (`offer_tools`)."""
    parallel = body.get("parallel_tool_calls")
    parallel = True if parallel is None else flag(body, "parallel_tool_calls")
    choice, function = _tool_choice(body.get("tool_choice"))
    return offer_tools(_tool_list(body.get("tools")),
                       ToolChoice(choice, function, parallel, short(body.get("tool_choice"))),
                       name_field="tools[{}].function.name")


def _tool_list(tools: Any) -> list[OfferedTool]:
    """The chat body's tools, each `{"type": "function", "function": {name, description,
    parameters}}`."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise bad("tools", "'tools' must be a list")
    out = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise bad("tools", f"'tools[{i}]' must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise bad("tools", f"'tools[{i}].function.description' must be a string")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise bad("tools", f"'tools[{i}].function.parameters' must be a JSON schema object")
        out.append(OfferedTool(function["name"], description, parameters))
    return out


def _tool_choice(choice: Any) -> tuple[str, str | None]:
    """(NONE | AUTO | REQUIRED | FUNCTION, the named function). The Responses API's flat
    `{"type": "function", "name": ...}` is read too: some clients send it here."""
    if choice is None:
        return AUTO, None
    if choice in (NONE, AUTO, REQUIRED):
        return choice, None
    if isinstance(choice, dict) and choice.get("type") == "function":
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else choice.get("name")
        if isinstance(name, str) and name:
            return FUNCTION, name
    raise bad("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
              f"{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {short(choice)}")


def bind(parsed: ParsedRequest, ready: Ready) -> ParsedRequest:
    """The request for the model its worker serves: answers are parsed in the worker's
    tool dialect, and a choice that forces a call gets the grammar for it. A forced call
    takes precedence over `response_format`: the answer is the call, not text."""
    if not isinstance(parsed, ChatRequest) or parsed.tools is None:
        return parsed
    add, dialect = parsed.add, dialect_named(ready.tool_dialect).name
    if parsed.tools.forces_call:
        if add.constraint is not None:
            logger.info("%s: tool_choice forces a call; response_format does not apply", add.request_id)
        grammar = forced_call_grammar(dialect, parsed.tools)
        add = dataclasses.replace(add, constraint=Constraint(kind="lark", source=grammar))
    elif add.constraint is None and parsed.tools.call_grammar:  # "auto": a call, once begun, is held to the tools
        add = dataclasses.replace(add, constraint=lazy_call_grammar(dialect, parsed.tools, add.request_id))
    return dataclasses.replace(parsed, add=add, tool_dialect=dialect)


@functools.lru_cache(maxsize=64)
def _grammar_problem(source: str) -> str | None:
    """`constraint_problem` of a Lark grammar, remembered: agents send the same tools with
    every turn, and checking 24 tools' schemas each time would cost the event loop."""
    return constraint_problem(Constraint("lark", source))


def lazy_call_grammar(dialect: str, tools: ToolRequest, label: str) -> Constraint | None:
    """The lazy grammar of an "auto" answer, or None where the engine cannot enforce these
    tools' schemas: then calls stay free, as before (an "auto" request is not refused
    for a schema feature it may never use)."""
    constraint = lazy_call_constraint(dialect, tools)
    problem = _grammar_problem(constraint.source)
    if problem is not None:
        logger.warning("%s: tool calls left free: the call grammar cannot be enforced (%s)", label,
                       problem.splitlines()[0])
        return None
    return constraint


class ToolCallAnswer:
    """One chat answer's text through the tool-call parser: OpenAI deltas while streaming
    (`feed`, `finish`), or the whole message (`message`), from the same parser."""

    def __init__(self, parser: ToolCallParser | LateParser) -> None:
        self._parser = parser

    @property
    def num_calls(self) -> int:
        return self._parser.num_calls

    @property
    def report(self) -> dict[str, Any] | None:
        """`mlxd.tool_calls` of the answer (once finished): calls read from text, repeats."""
        return self._parser.report if isinstance(self._parser, LateParser) else None

    def feed(self, text: str) -> list[dict[str, Any]]:
        """`stream_chunk` keyword arguments for the chunks `text` settles."""
        return _chunk_arguments(self._parser.feed(text))

    def finish(self) -> list[dict[str, Any]]:
        return _chunk_arguments(self._parser.finish())

    def message(self, text: str) -> tuple[str | None, list[dict[str, Any]] | None]:
        """The whole answer's content (None when it is only calls) and tool calls."""
        content, calls = gather(self._parser.feed(text) + self._parser.finish())
        if not calls:
            return content, None
        return content or None, message_tool_calls(calls)

    def finish_reason(self, reason: str) -> str:
        """"tool_calls" for an answer that ended by itself with calls in it."""
        return "tool_calls" if self.num_calls and reason == "stop" else reason


def _chunk_arguments(events: list[Event]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for event in events:
        if isinstance(event, TextDelta):
            if out and "text" in out[-1]:
                out[-1]["text"] += event.text
            else:
                out.append({"text": event.text})
        elif isinstance(event, CallStart):
            out.append({"tool_calls": [tool_call_start_delta(event.index, event.id, event.name)]})
        elif isinstance(event, ArgumentsDelta):
            out.append({"tool_calls": [tool_call_arguments_delta(event.index, event.fragment)]})
    return out


def tool_call_answer(parsed: ParsedRequest, stream: Any) -> ToolCallAnswer | None:
    """The answer's tool-call handling, or None when the request offers no tools."""
    if not isinstance(parsed, ChatRequest) or parsed.tools is None:
        return None
    return ToolCallAnswer(answer_parser(parsed, stream))


def answer_parser(parsed: ChatRequest, stream: Any) -> LateParser:
    """The tool-call parser of one answer to `parsed` (which offers tools), made at the
    answer's first text in the dialect of the worker the request went to: `stream.request`
    is the request as `bind` bound it there. A request that waited for its model started
    its answer before that worker was known (`router.pending_streams`)."""
    tools, label = parsed.tools, parsed.add.request_id
    assert tools is not None
    return LateParser(lambda: make_parser(tools, stream.request.tool_dialect, label),
                      last_results(parsed.add.messages), label)
