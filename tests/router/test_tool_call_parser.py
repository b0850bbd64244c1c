"""router.tool_calls: the streaming parser, per dialect. Every case is checked fed whole,
one character at a time, and cut in two at every position: all must give the same
content and calls, and no markup may reach the text."""

from __future__ import annotations

import itertools
import json
import logging
from typing import Any

import pytest

from protocol.tool_dialects import HERMES, LLAMA3_JSON, MISTRAL, MLXD
from router.tool_calls import (
    ArgumentsDelta,
    CallEnd,
    CallStart,
    Event,
    TextDelta,
    ToolCallParser,
    dialect_named,
    gather,
)

NAMES = ("get_weather", "read_file", "a", "b")
PARIS = {"city": "Paris"}
NESTED = {"filter": {"and": [{"x": "}{]["}, [1, 2, {"y": None}]]}, "quote": "say \"hi\" \\ {", "empty": {}}
Expected = tuple[str, list[tuple[str, dict[str, Any]]]]


def hermes_call(name: str, arguments: Any) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


CASES: list[tuple[str, str, str, list[tuple[str, dict[str, Any]]]]] = [
    # dialect, answer text, expected content, expected calls
    (HERMES, hermes_call("get_weather", PARIS), "", [("get_weather", PARIS)]),
    (HERMES, "Let me look that up.\n" + hermes_call("get_weather", PARIS), "Let me look that up.",
     [("get_weather", PARIS)]),
    (HERMES, hermes_call("read_file", NESTED), "", [("read_file", NESTED)]),
    (HERMES, hermes_call("a", {}) + "\n" + hermes_call("b", {"n": 1}) + "\n", "", [("a", {}), ("b", {"n": 1})]),
    (HERMES, "First.\n" + hermes_call("a", {}) + "\nThen some text.", "First.\nThen some text.", [("a", {})]),
    (HERMES, '<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>', "", [("a", {"x": 1})]),
    (HERMES, '<tool_call>\n{"name": "a", "arguments": {}}\n{"name": "b", "arguments": {}}\n</tool_call>', "",
     [("a", {}), ("b", {})]),
    (HERMES, '<tool_call>\n{"name": "a"}\n</tool_call>', "", [("a", {})]),
    (HERMES, "no calls: a < b, a <tool and </tool_call> alone", "no calls: a < b, a <tool and </tool_call> alone", []),
    (HERMES, "  spaced answer \n\n", "  spaced answer \n\n", []),
    (HERMES, "ends with a marker prefix <tool_ca", "ends with a marker prefix <tool_ca", []),
    # a bare call object at the start (Qwen2.5-Coder-0.5B writes them without the tags)
    (HERMES, json.dumps({"name": "get_weather", "arguments": PARIS}), "", [("get_weather", PARIS)]),
    (HERMES, '\n{"name": "a", "arguments": {}}\n{"name": "b", "arguments": {"n": [1]}}\n', "",
     [("a", {}), ("b", {"n": [1]})]),
    # ... with its braces doubled, as Qwen's template shows the format (the 1.5B, under OpenCode)
    (HERMES, '{{"name": "read_file", "arguments": {"path": "/tmp/hello.txt"}}}', "",
     [("read_file", {"path": "/tmp/hello.txt"})]),
    (HERMES, '<tool_call>\n{{"name": "a", "arguments": {}}}\n</tool_call>', "", [("a", {})]),
    (HERMES, 'Here: {"name": "a", "arguments": {}}', 'Here: {"name": "a", "arguments": {}}', []),  # not at the start
    # ... or in a code block (so does it, with a system prompt and two tools)
    (HERMES, '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```', "",
     [("get_weather", PARIS)]),
    (HERMES, '```\n{"name": "a", "arguments": {}}\n```\n```json\n{"name": "b", "arguments": {}}\n```\n', "",
     [("a", {}), ("b", {})]),
    (HERMES, "```python\nprint('{hi}')\n```\n", "```python\nprint('{hi}')\n```\n", []),
    (HERMES, "```json\n[1, 2]\n```", "```json\n[1, 2]\n```", []),
    (HERMES, '```json\n{"a": 1} and more\n```', '```json\n{"a": 1} and more\n```', []),
    (HERMES, '```jsonl\n{"a": 1}\n```', '```jsonl\n{"a": 1}\n```', []),
    (HERMES, 'Use:\n```json\n{"name": "a", "arguments": {}}\n```', 'Use:\n```json\n{"name": "a", "arguments": {}}\n```',
     []),
    (MLXD, "Sure.\n" + hermes_call("get_weather", PARIS), "Sure.", [("get_weather", PARIS)]),
    (MLXD, json.dumps({"name": "read_file", "arguments": NESTED}), "", [("read_file", NESTED)]),
    (LLAMA3_JSON, json.dumps({"name": "get_weather", "parameters": PARIS}), "", [("get_weather", PARIS)]),
    (LLAMA3_JSON, "\n\n " + json.dumps({"type": "function", "name": "read_file", "parameters": NESTED}), "",
     [("read_file", NESTED)]),
    (LLAMA3_JSON, "<|python_tag|>" + json.dumps({"name": "get_weather", "parameters": PARIS}), "",
     [("get_weather", PARIS)]),
    (LLAMA3_JSON, '{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": [1, {"y": "}"}]}}', "",
     [("a", {}), ("b", {"x": [1, {"y": "}"}]})]),
    (LLAMA3_JSON, 'Calling: <|python_tag|>{"name": "a", "parameters": {}}', "Calling:", [("a", {})]),
    (LLAMA3_JSON, "The weather is fine.", "The weather is fine.", []),
    (MISTRAL, "[TOOL_CALLS]" + json.dumps([{"name": "get_weather", "arguments": PARIS}]), "",
     [("get_weather", PARIS)]),
    (MISTRAL, json.dumps([{"name": "a", "arguments": NESTED}, {"name": "b", "arguments": {}, "id": "abc123XYZ"}]),
     "", [("a", NESTED), ("b", {})]),
    (MISTRAL, 'Checking. [TOOL_CALLS][{"name": "a", "arguments": {"q": "[x]"}}]', "Checking.", [("a", {"q": "[x]"})]),
    (MISTRAL, '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "", [("get_weather", PARIS)]),
    (MISTRAL, "Plain [bracketed] text.", "Plain [bracketed] text.", []),
]

MALFORMED: list[tuple[str, str, str]] = [
    # dialect, answer text (returned as text, exactly), what is wrong
    (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>', "bad JSON"),
    (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', "unclosed"),
    (HERMES, 'Text.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n', "no closing tag"),
    (HERMES, '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', "unknown function"),
    (HERMES, '<tool_call>{"name": "a", "arguments": [1]}</tool_call>', "arguments not an object"),
    (HERMES, "<tool_call>just words</tool_call>", "not JSON"),
    (HERMES, '{"answer": 42}', "JSON that is no call"),
    (HERMES, '{{"answer": 42}}', "doubled braces around JSON that is no call"),
    (HERMES, '```json\n{"answer": 42}\n```', "JSON in a code block that is no call"),
    (HERMES, '```json\n{"name": "a", "arguments": {}}\n', "a code block never closed"),
    (MLXD, '{"name": "Ada", "age": 36}', "JSON naming no offered function"),
    (LLAMA3_JSON, '{"answer": 42}', "JSON that is no call"),
    (LLAMA3_JSON, '{"name": "get_weather", "parameters": {"city": "Par', "unclosed"),
    (LLAMA3_JSON, '<|python_tag|>brave_search.call(query="weather")', "built-in tool, not JSON"),
    (MISTRAL, "[1, 2, 3]", "a list, not calls"),
    (MISTRAL, " \n [1, 2]\n", "a list after space, not calls"),
    (MISTRAL, '[TOOL_CALLS][{"name": "a", "arguments": 5}]', "arguments not an object"),
    (MISTRAL, '[TOOL_CALLS][{"name": "a", "arguments": {}}', "unclosed"),
]


def run(dialect: str, pieces: list[str], names: tuple[str, ...] = NAMES, **kwargs: Any) -> list[Event]:
    ids = (f"call_{i}" for i in itertools.count())
    parser = ToolCallParser(dialect_named(dialect), names, make_id=lambda: next(ids), **kwargs)
    events: list[Event] = []
    for piece in pieces:
        events += parser.feed(piece)
    return events + parser.finish()


def result(events: list[Event]) -> Expected:
    text, calls = gather(events)
    return text, [(call.name, json.loads(call.arguments)) for call in calls]


def cuts(text: str) -> list[list[str]]:
    """The text whole, character by character, and cut in two at every position."""
    return [[text], list(text), *([text[:i], text[i:]] for i in range(1, len(text)))]


def markup(dialect: str) -> list[str]:
    return {HERMES: ["<tool_call>", "</tool_call>"], MLXD: ["<tool_call>", "</tool_call>"],
            LLAMA3_JSON: ["<|python_tag|>", '"parameters"'], MISTRAL: ["[TOOL_CALLS]", "[ARGS]", '"arguments"']}[dialect]


@pytest.mark.parametrize("dialect, text, content, calls", CASES)
def test_every_cut_gives_the_same_content_and_calls(dialect: str, text: str, content: str,
                                                    calls: list[tuple[str, dict[str, Any]]]) -> None:
    for pieces in cuts(text):
        events = run(dialect, pieces)
        assert result(events) == (content, calls), pieces
        if calls:
            leaked = [m for m in markup(dialect) for e in events if isinstance(e, TextDelta) and m in e.text]
            assert not leaked, (pieces, leaked)


@pytest.mark.parametrize("dialect, text, why", MALFORMED)
def test_a_malformed_or_unclosed_call_is_returned_as_text_with_a_log_line(
        dialect: str, text: str, why: str, caplog: pytest.LogCaptureFixture) -> None:
    for pieces in cuts(text):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="router.tool_calls.parser"):
            events = run(dialect, pieces, label="req-1")
        assert result(events) == (text, []), (why, pieces)
        assert any("req-1" in r.getMessage() and "returned as text" in r.getMessage() for r in caplog.records), why


def test_events_are_openai_shaped_in_order() -> None:
    text = "Sure.\n" + hermes_call("a", {"x": 1}) + "\n" + hermes_call("b", {})
    events = run(HERMES, list(text))
    assert [e for e in events if not isinstance(e, TextDelta)] == [
        CallStart(0, "call_0", "a"), ArgumentsDelta(0, '{"x": 1}'), CallEnd(0),
        CallStart(1, "call_1", "b"), ArgumentsDelta(1, "{}"), CallEnd(1),
    ]
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Sure."


def test_a_marker_split_across_tokens_is_held_back_not_leaked() -> None:
    parser = ToolCallParser(dialect_named(HERMES), NAMES)
    assert parser.feed("Look: <tool") == [TextDelta("Look:")]  # "<tool" might open a call; " " is layout
    assert parser.feed("_c") == []
    assert parser.feed("all>\n{") == []
    parser.feed('"name": "a", "arguments": {}}\n</tool_call>')
    assert parser.num_calls == 1


def test_text_streams_as_it_comes_when_no_marker_is_possible() -> None:
    parser = ToolCallParser(dialect_named(HERMES), NAMES)
    assert parser.feed("Hello") == [TextDelta("Hello")]
    assert parser.feed(" world") == [TextDelta(" world")]
    assert parser.finish() == []


def test_parallel_tool_calls_false_keeps_only_the_first_call() -> None:
    text = hermes_call("a", {}) + "\n" + hermes_call("b", {})
    for pieces in cuts(text):
        assert result(run(HERMES, pieces, max_calls=1)) == ("", [("a", {})])


def test_a_malformed_call_then_a_good_one() -> None:
    bad = "<tool_call>oops</tool_call>"
    text = bad + "\n" + hermes_call("a", {})
    for pieces in cuts(text):
        assert result(run(HERMES, pieces)) == (bad, [("a", {})])


def test_only_offered_functions_are_calls() -> None:
    assert result(run(HERMES, [hermes_call("get_weather", PARIS)], names=("read_file",)))[1] == []


def test_a_long_call_is_scanned_once_not_per_token() -> None:
    """A 200 KB argument fed in 4-character pieces: linear, not quadratic, in its length."""
    big = {"content": "x" * 200_000}
    text = json.dumps([{"name": "a", "arguments": big}])
    pieces = [text[i:i + 4] for i in range(0, len(text), 4)]
    assert result(run(MISTRAL, pieces)) == ("", [("a", big)])


@pytest.mark.parametrize("text, content, calls", [
    ('{"name": "a", "arguments": {}}\n{"name": "b", "arguments": {}}\n{"name": "a", "argu',
     '\n{"name": "a", "argu', [("a", {}), ("b", {})]),
    (hermes_call("a", {}) + '\n<tool_call>\n{"name": "b",', '\n<tool_call>\n{"name": "b",', [("a", {})]),
])
def test_a_call_cut_short_at_the_end_costs_only_itself(text: str, content: str,
                                                        calls: list[tuple[str, dict[str, Any]]]) -> None:
    """max_tokens ran out inside the last call: the complete ones stay calls."""
    for pieces in cuts(text):
        assert result(run(HERMES, pieces)) == (content, calls), pieces


def test_a_code_answer_streams_as_it_comes() -> None:
    """A code block that holds no call is given up at its first character."""
    parser = ToolCallParser(dialect_named(HERMES), NAMES)
    assert parser.feed("```") == []  # may open a call block
    assert gather(parser.feed("py")) == ("```py", [])
    assert parser.feed("thon\nprint(1)") == [TextDelta("thon\nprint(1)")]
