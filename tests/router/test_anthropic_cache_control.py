"""Anthropic `cache_control` -> the worker's CacheBreakpoints: each marked block becomes a
point of the internal request (tools, system, messages; merged and split turns followed),
the prompt itself never changes, and bad or too many breakpoints are Anthropic's 400s."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from protocol.cache_breakpoints import TTL_1H_S, TTL_5M_S, CacheBreakpoint
from protocol.errors import RequestError
from router.api.anthropic_messages import parse

CLIENTS = Path(__file__).resolve().parents[1] / "clients"
BILLING = "x-anthropic-billing-header: cc_version=2.1.332.500; cc_entrypoint=cli; cch=a1b2c;"
CC = {"type": "ephemeral"}
CC_1H = {"type": "ephemeral", "ttl": "1h"}
TOOL = {"name": "Read", "description": "read", "input_schema": {"type": "object"}}


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], **fields}


def text(value: str, control: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "text", "text": value, **({"cache_control": control} if control is not None else {})}


def points(request: dict[str, Any]) -> list[CacheBreakpoint]:
    return parse(request).add.cache_breakpoints


def without_cache_control(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [without_cache_control(v) for v in value]
    return value


def test_system_blocks_after_the_billing_line() -> None:
    request = body(system=[text(BILLING), text("You are Claude Code.", CC), text("Rules.", CC_1H)])
    assert parse(request).add.messages[0] == {"role": "system", "content": "You are Claude Code.\nRules."}
    # the first up to its text, the last the whole system message
    assert points(request) == [CacheBreakpoint(TTL_5M_S, 0, len("You are Claude Code.")),
                               CacheBreakpoint(TTL_1H_S, 0, -1)]


def test_a_breakpoint_on_the_billing_line_alone_marks_nothing() -> None:
    assert points(body(system=[text(BILLING, CC), text("s")])) == []


def test_tools_then_system_then_messages() -> None:
    request = body(tools=[TOOL, {"type": "web_search_20250305", "name": "web_search", "cache_control": CC},
                          {**TOOL, "name": "Glob", "cache_control": CC_1H}],
                   system="s", messages=[{"role": "user", "content": [text("hi", CC)]}])
    # the server tool is dropped: its breakpoint falls after the tools kept before it
    assert points(request) == [CacheBreakpoint(TTL_5M_S, num_tools=1), CacheBreakpoint(TTL_1H_S, num_tools=2),
                               CacheBreakpoint(TTL_5M_S, 1, -1)]


def test_tool_breakpoints_go_with_the_tools() -> None:
    request = body(tools=[{**TOOL, "cache_control": CC}], tool_choice={"type": "none"})
    assert parse(request).add.tools is None and points(request) == []


def test_history_blocks_mark_the_messages_they_became() -> None:
    request = body(messages=[
        {"role": "user", "content": [text("read it", CC)]},
        {"role": "assistant", "content": [text("Reading."), {"type": "tool_use", "id": "toolu_1", "name": "Read",
                                                              "input": {}, "cache_control": CC}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "hello", "cache_control": CC},
            text("<reminder>r</reminder>", CC_1H)]},
    ])
    assert [m["role"] for m in parse(request).add.messages] == ["user", "assistant", "tool", "user"]
    assert points(request) == [CacheBreakpoint(TTL_5M_S, 0, -1), CacheBreakpoint(TTL_5M_S, 1, -1),
                               CacheBreakpoint(TTL_5M_S, 2, -1), CacheBreakpoint(TTL_1H_S, 3, -1)]


def test_a_text_before_a_tool_result_marks_the_user_text_after_it() -> None:
    request = body(messages=[{"role": "user", "content": [text("first", CC), text("second"), {
        "type": "tool_result", "tool_use_id": "t", "content": "r"}]}])
    messages = parse(request).add.messages
    assert messages == [{"role": "tool", "tool_call_id": "t", "content": "r"},
                        {"role": "user", "content": "first\nsecond"}]
    assert points(request) == [CacheBreakpoint(TTL_5M_S, 1, len("first"))]


@pytest.mark.parametrize("messages, merged, expected", [
    # the second user text merges into the first turn: its point moves with it
    ([{"role": "user", "content": [text("a", CC)]}, {"role": "user", "content": "bb"}], "a\n\nbb",
     CacheBreakpoint(TTL_5M_S, 0, 1)),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": [text("bb", CC), text("c")]}], "a\n\nbb\nc",
     CacheBreakpoint(TTL_5M_S, 0, len("a\n\nbb"))),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": [text("bb", CC)]}], "a\n\nbb",
     CacheBreakpoint(TTL_5M_S, 0, -1)),
])
def test_merged_user_turns(messages: list[dict[str, Any]], merged: str, expected: CacheBreakpoint) -> None:
    request = body(messages=messages)
    assert parse(request).add.messages == [{"role": "user", "content": merged}]
    assert points(request) == [expected]


def test_a_late_system_entry_and_the_top_level_automatic_breakpoint() -> None:
    request = body(system="s", cache_control=CC_1H, messages=[
        {"role": "user", "content": "hi"}, {"role": "system", "content": [text("note", CC), text("more")]},
        {"role": "user", "content": "go"}])
    assert points(request) == [CacheBreakpoint(TTL_5M_S, 2, len("note")), CacheBreakpoint(TTL_1H_S, 3, -1)]


def test_a_breakpoint_on_a_dropped_final_assistant_turn_is_dropped() -> None:
    request = body(messages=[{"role": "user", "content": "hi"},
                             {"role": "assistant", "content": [{"type": "thinking", "thinking": "x",
                                                                "cache_control": CC}]}])
    assert len(parse(request).add.messages) == 1 and points(request) == []


@pytest.mark.parametrize("name", ["claude-code-messages-main-turn-default-model.json",
                                  "claude-code-messages-tool-result-roundtrip.json",
                                  "claude-code-messages-thinking-block-in-history.json",
                                  "anthropic-python-messages-stream-tools-thinking.json"])
def test_captured_bodies_keep_their_prompt_and_carry_their_breakpoints(name: str) -> None:
    captured = json.loads((CLIENTS / name).read_text())["body"]
    parsed = parse(captured)
    assert parsed.add.messages == parse(without_cache_control(captured)).add.messages
    assert parse(without_cache_control(captured)).add.cache_breakpoints == []
    found = parsed.add.cache_breakpoints
    assert 1 <= len(found) <= 4
    for point in found:
        assert 0 <= point.message_index < len(parsed.add.messages)
        content = parsed.add.messages[point.message_index]["content"]
        assert point.content_chars == -1 or 0 < point.content_chars < len(content)


@pytest.mark.parametrize("fields, message", [
    ({"system": [text("s", {"type": "ephemeral", "ttl": "2h"})]}, "'system[0].cache_control.ttl' must be"),
    ({"system": [{"type": "text", "text": "s", "cache_control": "ephemeral"}]}, "'system[0].cache_control' must be"),
    ({"cache_control": {"type": "ephemeral", "ttl": 300}}, "'cache_control.ttl' must be"),
    ({"system": [text(str(i), CC) for i in range(3)], "messages": [{"role": "user", "content": [text("a", CC)]}],
      "tools": [{**TOOL, "cache_control": CC}]}, "A maximum of 4 blocks with cache_control may be provided. Found 5."),
])
def test_bad_breakpoints_are_400s(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(RequestError) as error:
        parse(body(**fields))
    assert error.value.status == 400 and message in error.value.message


def test_an_unknown_cache_control_type_is_not_a_breakpoint() -> None:
    assert points(body(system=[text("s", {"type": "persistent"})])) == []
    assert points(body(system=[text("s", {})])) == [CacheBreakpoint(TTL_5M_S, 0, -1)]  # ephemeral, unsaid
