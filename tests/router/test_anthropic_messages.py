"""The Messages body -> chat-template messages: shapes that must render the same, blocks
that must not fail a request, prefill, tools and tool choice."""

from __future__ import annotations

import json
from typing import Any

import pytest

from protocol.errors import RequestError
from router.api.anthropic_messages import chat_messages, parse
from router.api.billing_header import without_billing_lines
from router.images import pull_images
from router.tool_calls import FUNCTION, REQUIRED

BILLING = "x-anthropic-billing-header: cc_version=2.1.332.500; cc_entrypoint=cli; cch=a1b2c;"


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], **fields}


@pytest.mark.parametrize("texts, kept", [
    ([BILLING, "You are helpful."], ["You are helpful."]),
    ([f"{BILLING}\nYou are helpful."], ["You are helpful."]),
    (["  " + BILLING], []),
    (["You are helpful.", "x-anthropic-billing-header is a header"], ["You are helpful.",
                                                                      "x-anthropic-billing-header is a header"]),
])
def test_billing_lines_are_dropped(texts: list[str], kept: list[str]) -> None:
    assert without_billing_lines(texts) == kept


def test_a_string_and_text_blocks_render_the_same() -> None:
    as_strings = body(system="s", messages=[{"role": "user", "content": "hi"}, {"role": "system", "content": "late"}])
    as_blocks = body(system=[{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
                     messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                               {"role": "system", "content": [{"type": "text", "text": "late",
                                                               "cache_control": {"type": "ephemeral"}}]}])
    assert chat_messages(as_strings) == chat_messages(as_blocks)
    messages, _ = chat_messages(as_strings)
    # in place, not hoisted: a late system note leaves the cached prefix before it alone
    assert messages == [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"},
                        {"role": "system", "content": "late"}]


def test_the_billing_block_is_kept_when_normalisation_is_off() -> None:
    request = body(system=[{"type": "text", "text": BILLING}, {"type": "text", "text": "s"}])
    assert chat_messages(request)[0][0]["content"] == "s"
    assert chat_messages(request, normalize_billing_header=False)[0][0]["content"] == f"{BILLING}\ns"


def test_history_blocks_become_calls_results_and_text() -> None:
    request = body(messages=[
        {"role": "user", "content": [{"type": "text", "text": "read it"},
                                     {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                  "data": "iVBORw0KGgo="}}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hm", "signature": "sig"}, {"type": "redacted_thinking", "data": "x"},
            {"type": "text", "text": "Reading."},
            {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "a.txt"}},
            {"type": "server_tool_use", "id": "srv", "name": "web_search", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "cache_control": {"type": "ephemeral"},
             "content": [{"type": "text", "text": "hello"}, {"type": "tool_reference", "tool_name": "Bash"}]},
            {"type": "text", "text": "<system-reminder>r</system-reminder>"},
            {"type": "brand_new_block", "x": 1}]},
    ])
    messages, prefill = chat_messages(request)
    messages, images = pull_images(messages)
    assert prefill == "" and [(i.where, i.data) for i in images] == [("messages[0].content[1].source",
                                                                     b"\x89PNG\r\n\x1a\n")]
    assert messages == [
        {"role": "user", "content": [{"type": "text", "text": "read it"}, {"type": "image"}]},
        {"role": "assistant", "content": "Reading.", "reasoning_content": "hm", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "Read", "arguments": '{"path": "a.txt"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1",
         "content": "hello\n" + json.dumps({"tool_name": "Bash", "type": "tool_reference"})},
        {"role": "user", "content": "<system-reminder>r</system-reminder>"},
    ]


def test_a_final_assistant_message_is_a_prefill() -> None:
    parsed = parse(body(messages=[{"role": "user", "content": "topic?"}, {"role": "assistant", "content": "{"}]))
    assert parsed.prefill == "{" and parsed.add.continue_final_message
    assert parsed.add.messages[-1] == {"role": "assistant", "content": "{"}
    assert not parse(body()).add.continue_final_message


def test_consecutive_user_turns_are_merged() -> None:
    messages, _ = chat_messages(body(messages=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]))
    assert messages == [{"role": "user", "content": "a\n\nb"}]


@pytest.mark.parametrize("choice, kind, function", [
    ({"type": "any"}, REQUIRED, None),
    ({"type": "tool", "name": "Read"}, FUNCTION, "Read"),
    ({"type": "auto", "disable_parallel_tool_use": True}, "auto", None),
])
def test_tools_and_tool_choice(choice: dict[str, Any], kind: str, function: str | None) -> None:
    tools = [{"name": "Read", "description": "read", "input_schema": {"type": "object"}, "cache_control": {}},
             {"type": "web_search_20250305", "name": "web_search"}]
    parsed = parse(body(tools=tools, tool_choice=choice))
    assert parsed.add.tools == [{"type": "function", "function": {"name": "Read", "description": "read",
                                                                  "parameters": {"type": "object"}}}]
    assert parsed.tools.choice == kind and parsed.tools.function == function
    assert parsed.tools.parallel is (choice.get("disable_parallel_tool_use") is not True)
    none = parse(body(tools=tools, tool_choice={"type": "none"}))
    assert none.add.tools is None and none.tools is None


@pytest.mark.parametrize("thinking", [{"type": "adaptive", "display": "omitted"},
                                      {"type": "enabled", "budget_tokens": 31999}, {"type": "disabled"}])
def test_sampling_fields_and_thinking(thinking: dict[str, Any]) -> None:
    parsed = parse(body(max_tokens=128000, thinking=thinking, stop_sequences=["END"], temperature=0.5, top_k=40,
                        metadata={"user_id": "{}"}, context_management={}))
    sampling = parsed.add.sampling
    assert (sampling.max_tokens, sampling.stop, sampling.temperature, sampling.top_k) == (128000, ["END"], 0.5, 40)


@pytest.mark.parametrize("fields, param", [
    ({"max_tokens": None}, "max_tokens"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages"),
    ({"stop_sequences": "END"}, "stop_sequences"),
    ({"tool_choice": {"type": "tool", "name": "nope"}, "tools": [{"name": "Read", "input_schema": {}}]},
     "tool_choice"),
])
def test_bad_bodies_are_400s_naming_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as error:
        parse(body(**fields))
    assert error.value.status == 400 and error.value.param == param


READ = {"name": "Read", "input_schema": {"type": "object"}}


@pytest.mark.parametrize("fields, says", [
    ({"tools": [{"input_schema": {"type": "object"}}]}, "'tools[0].name' must be a non-empty string"),
    ({"tools": [READ, {"name": "Read", "input_schema": {}}]}, "'tools[1].name' 'Read' is offered twice"),
    ({"tools": [{"name": "Read", "input_schema": "object"}]}, "'tools[0].input_schema' must be a JSON schema"),
    ({"tools": [{"name": "Read", "description": 3, "input_schema": {}}]}, "'tools[0].description' must be a string"),
    ({"tool_choice": {"type": "any"}}, "'tool_choice' {'type': 'any'} needs 'tools'"),
])
def test_a_bad_tool_is_told_in_anthropics_own_field_names(fields: dict[str, Any], says: str) -> None:
    """Tools are read in Anthropic's spelling: the error never asks an Anthropic client for
    OpenAI's `{"type": "function", "function": ...}`."""
    with pytest.raises(RequestError) as error:
        parse(body(**fields))
    assert error.value.status == 400 and says in error.value.message
    assert "function" not in error.value.message
