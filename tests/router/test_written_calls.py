"""Calls written as text (issue 33 part 3): an answer that is only one call in a form its
dialect does not use becomes that call when its arguments fit exactly that tool's schema,
and stays text otherwise. Every case is fed whole, one character at a time and cut in two
at every position: all must agree."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from protocol.tool_dialects import HERMES, LLAMA3_JSON, MISTRAL, MLXD
from router.tool_calls import AUTO, ToolRequest, ToolSpec, gather, make_parser
from router.tool_calls.offer import OfferedTool, ToolChoice, offer_tools
from tests.router.test_tool_call_parser import cuts

READ = ToolSpec("Read", {"type": "object", "properties": {"file_path": {"type": "string"},
                                                          "offset": {"type": "integer"}},
                         "required": ["file_path"], "additionalProperties": False})
GLOB = ToolSpec("Glob", {"type": "object", "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}},
                         "required": ["pattern"], "additionalProperties": False})
WEATHER = ToolSpec("get_weather", {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]})
TOOLS = (READ, GLOB, WEATHER)
NOTES = {"file_path": "/work/zebra_notes.txt", "offset": 0}
PARIS = {"city": "Paris", "unit": "c"}


def answer(text: str, dialect: str = HERMES, tools: tuple[ToolSpec, ...] = TOOLS, **choice: Any
           ) -> list[tuple[str, list[tuple[str, Any]], int]]:
    """(content, calls, calls read from text) for every cut of `text`."""
    out = []
    for pieces in cuts(text):
        parser = make_parser(ToolRequest(tools, **choice), dialect, "req-1")
        events = [event for piece in pieces for event in parser.feed(piece)] + parser.finish()
        content, calls = gather(events)
        out.append((content, [(c.name, json.loads(c.arguments)) for c in calls], parser.num_recovered))
    return out


RECOVERED = [
    # dialect, answer, the call
    (HERMES, "# Read\n" + json.dumps(NOTES), ("Read", NOTES)),  # Qwen2.5-Coder-1.5B under Claude Code
    (HERMES, "## `Read`:\n\n```json\n" + json.dumps(NOTES) + "\n```\n", ("Read", NOTES)),
    (HERMES, "Read: " + json.dumps(NOTES), ("Read", NOTES)),
    (HERMES, "  Glob\n```\n{\"pattern\": \"*.py\"}\n```", ("Glob", {"pattern": "*.py"})),
    (HERMES, json.dumps({"name": "get_weather", "arguments": PARIS}), ("get_weather", PARIS)),  # the 0.5B
    (HERMES, "```json\n" + json.dumps({"name": "get_weather", "arguments": PARIS}) + "\n```", ("get_weather", PARIS)),
    (MLXD, "# get_weather\n" + json.dumps(PARIS), ("get_weather", PARIS)),
    (LLAMA3_JSON, "```json\n" + json.dumps({"name": "Read", "parameters": NOTES}) + "\n```", ("Read", NOTES)),
    (LLAMA3_JSON, "`Glob` {\"pattern\": \"a*\"}", ("Glob", {"pattern": "a*"})),
    (MISTRAL, json.dumps({"name": "get_weather", "arguments": PARIS}), ("get_weather", PARIS)),
    (MISTRAL, "```json\n" + json.dumps({"name": "get_weather", "arguments": PARIS}) + "\n```", ("get_weather", PARIS)),
    (MISTRAL, "# Read\n" + json.dumps(NOTES) + "\n\n", ("Read", NOTES)),
]


@pytest.mark.parametrize("dialect, text, call", RECOVERED)
def test_each_form_is_read_as_its_call(dialect: str, text: str, call: tuple[str, Any]) -> None:
    assert set(map(repr, answer(text, dialect))) == {repr(("", [call], 1))}


NOT_RECOVERED = [
    # dialect, answer, tools, why it stays text
    (HERMES, "# get_weather\n" + json.dumps({"city": "Paris", "unit": "celsius"}), TOOLS, "fits no tool's schema"),
    (HERMES, json.dumps({"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}), TOOLS,
     "a call object whose arguments break the schema"),
    (HERMES, "```json\n" + json.dumps({"name": "Read", "arguments": {"path": "x"}}) + "\n```", TOOLS,
     "a fenced call object whose arguments break the schema"),
    (MISTRAL, json.dumps({"name": "get_weather", "arguments": {}}), TOOLS, "a required key missing"),
    (HERMES, "# Read\n" + json.dumps(NOTES), (READ, ToolSpec("Write", READ.parameters)), "fits two tools"),
    (HERMES, "# Read\n" + json.dumps(NOTES), (READ, ToolSpec("Anything")), "fits two tools (one takes any object)"),
    (HERMES, "# Write\n" + json.dumps(NOTES), TOOLS, "names no offered tool"),
    (MISTRAL, json.dumps({"name": "Write", "arguments": NOTES}), TOOLS, "a call object naming no offered tool"),
    (HERMES, "Let me read it.\n# Read\n" + json.dumps(NOTES), TOOLS, "text before it"),
    (HERMES, "# Read\n" + json.dumps(NOTES) + "\nThat reads the notes.", TOOLS, "text after it"),
    (MISTRAL, "```json\n" + json.dumps({"name": "Read", "arguments": NOTES}) + "\n```\nDone.", TOOLS,
     "text after the block"),
    (HERMES, "# Read\n" + json.dumps(NOTES)[:-3], TOOLS, "cut before its end"),
    (HERMES, "# Read the notes\n" + json.dumps(NOTES), TOOLS, "a heading that is not only the name"),
]


@pytest.mark.parametrize("dialect, text, tools, why", NOT_RECOVERED)
def test_it_stays_text(dialect: str, text: str, tools: tuple[ToolSpec, ...], why: str) -> None:
    assert set(map(repr, answer(text, dialect, tools))) == {repr((text, [], 0))}, why


@pytest.mark.parametrize("dialect, text, call", RECOVERED)
def test_the_switch_off_leaves_the_text(dialect: str, text: str, call: tuple[str, Any]) -> None:
    assert set(map(repr, answer(text, dialect, text_recovery=False))) == {repr((text, [], 0))}


def test_the_calls_in_the_models_own_markup_do_not_count_as_recovered() -> None:
    text = "<tool_call>\n" + json.dumps({"name": "get_weather", "arguments": PARIS}) + "\n</tool_call>"
    assert answer(text)[0] == ("", [("get_weather", PARIS)], 0)
    assert answer(text, text_recovery=False)[0] == ("", [("get_weather", PARIS)], 0)


def test_under_tool_choice_none_there_is_no_parser_at_all() -> None:
    """`tool_choice: "none"`: no ToolRequest, so nothing reads the answer for calls."""
    tools = [OfferedTool(t.name, None, t.parameters) for t in TOOLS]
    assert offer_tools(tools, ToolChoice("none", spelled="none")) == (None, None)
    assert offer_tools(tools, ToolChoice(AUTO))[1] is not None


def test_each_recovery_is_logged_naming_the_request_and_tool(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="router.tool_calls.parser"):
        answer("# Read\n" + json.dumps(NOTES))
    assert "req-1: read a call to 'Read' written as text" in caplog.text


def test_prose_and_code_stream_at_once() -> None:
    """An answer held back while it may be a call is let go at the first character that
    rules that out, not at its end."""
    parser = make_parser(ToolRequest(TOOLS), HERMES, "req-1")
    assert parser.feed("Rea") == []  # may still be `Read` and its arguments
    assert gather(parser.feed("ding the file")) == ("Reading the file", [])
    parser = make_parser(ToolRequest(TOOLS), MISTRAL, "req-1")
    assert gather(parser.feed("def f():")) == ("def f():", [])
    parser = make_parser(ToolRequest(TOOLS), HERMES, "req-1")
    assert parser.feed("# Read\n{\"file_path\": ") == []
    assert gather(parser.feed("\"x\"} and then")) == ("# Read\n{\"file_path\": \"x\"} and then", [])
