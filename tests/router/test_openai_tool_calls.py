"""Tool calls on the OpenAI chat API through the real router, in front of a fake worker whose
answer holds text and two calls in the Hermes markup, markers split across tokens; and the
request side: tools, tool_choice, parallel_tool_calls, and the grammar a forced call gets."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from protocol.messages import Ready
from protocol.tool_dialects import HERMES, LLAMA3_JSON, MISTRAL, MLXD
from router.api.openai_chat import parse
from router.api.openai_tool_calls import ChatRequest, bind
from router.tool_calls import FUNCTION, REQUIRED
from tests.router.fake_worker import TOOL_REPLY
from tests.router.router_harness import MODEL_ID, RunningRouter

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "TOOLCALL weather?"}]
CALLS = [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Rome"}')]


@pytest.fixture
def sdk(router: RunningRouter) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0, timeout=20)


def test_non_streamed_calls(sdk: openai.OpenAI) -> None:
    choice = sdk.chat.completions.create(model=MODEL_ID, messages=ASK, tools=[WEATHER]).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "I will check."
    calls = choice.message.tool_calls
    assert [(c.function.name, c.function.arguments) for c in calls] == CALLS
    assert all(c.type == "function" and c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id


def test_streamed_deltas_are_openai_shaped_and_add_up_to_the_same_calls(sdk: openai.OpenAI) -> None:
    chunks = list(sdk.chat.completions.create(model=MODEL_ID, messages=ASK, tools=[WEATHER], stream=True,
                                              stream_options={"include_usage": True}))
    content, calls, finish = "", {}, None
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                if delta.index not in calls:  # the first delta of a call: id, type and name, no arguments yet
                    assert delta.id.startswith("call_") and delta.type == "function"
                    assert delta.function.name and delta.function.arguments == ""
                    calls[delta.index] = [delta.function.name, ""]
                else:
                    assert delta.id is None and delta.function.name is None
                    calls[delta.index][1] += delta.function.arguments
            finish = choice.finish_reason or finish
    assert content == "I will check." and "<tool" not in content
    assert sorted(calls) == [0, 1] and [tuple(calls[i]) for i in (0, 1)] == CALLS
    assert finish == "tool_calls"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None


def test_parallel_tool_calls_false_keeps_the_first(sdk: openai.OpenAI) -> None:
    for stream in (False, True):
        if stream:
            chunks = sdk.chat.completions.create(model=MODEL_ID, messages=ASK, tools=[WEATHER], stream=True,
                                                 parallel_tool_calls=False)
            indices = {d.index for c in chunks for ch in c.choices for d in ch.delta.tool_calls or []}
            assert indices == {0}
        else:
            message = sdk.chat.completions.create(model=MODEL_ID, messages=ASK, tools=[WEATHER],
                                                  parallel_tool_calls=False).choices[0].message
            assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == CALLS[:1]


def test_tool_choice_none_neither_renders_nor_parses(sdk: openai.OpenAI) -> None:
    choice = sdk.chat.completions.create(model=MODEL_ID, messages=ASK, tools=[WEATHER],
                                         tool_choice="none").choices[0]
    assert choice.message.tool_calls is None and "<tool_call>" in choice.message.content
    assert choice.finish_reason == "stop"
    body = {"model": MODEL_ID, "messages": ASK, "tools": [WEATHER], "tool_choice": "none"}
    assert parse(body).add.tools is None


def test_without_tools_the_markup_is_plain_text(sdk: openai.OpenAI) -> None:
    message = sdk.chat.completions.create(model=MODEL_ID, messages=ASK).choices[0].message
    assert message.tool_calls is None and message.content == "".join(TOOL_REPLY)


@pytest.mark.parametrize("assistant_content", [None, "", []])
def test_a_tool_round_trip_history_is_accepted(sdk: openai.OpenAI, assistant_content: Any) -> None:
    history = [*ASK, {"role": "assistant", "content": assistant_content, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "18 C"}]}]
    response = sdk.chat.completions.create(model=MODEL_ID, messages=history, tools=[WEATHER])
    assert response.choices[0].finish_reason == "stop"  # the fake worker answers the tool result in text
    assert response.choices[0].message.content and response.choices[0].message.tool_calls is None
    add = parse({"model": MODEL_ID, "messages": history, "tools": [WEATHER]}).add
    assert add.messages[1]["content"] == "" and add.messages[2]["content"] == "18 C"


@pytest.mark.parametrize("fields, message", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "does not hold"),
    ({"tool_choice": "sometimes"}, "'tool_choice' must be"),
    ({"tool_choice": 3}, "'tool_choice' must be"),
    ({"tools": [WEATHER, WEATHER]}, "offered twice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "JSON schema object"),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"tools": [], "tool_choice": "required"}, "needs 'tools'"),
    ({"tool_choice": "required", "tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}}}]}, "uniqueItems"),
])
def test_bad_tool_fields_are_400s(router: RunningRouter, fields: dict[str, Any], message: str) -> None:
    body = {"model": MODEL_ID, "messages": ASK, "tools": [WEATHER], **fields}
    with router.client() as client:
        response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]["message"]


def test_tools_reach_the_worker_reduced_to_what_templates_read() -> None:
    add = parse({"model": MODEL_ID, "messages": ASK, "tools": [WEATHER]}).add
    assert add.tools == [{"type": "function", "function": {k: WEATHER["function"][k]
                                                           for k in ("name", "description", "parameters")}}]
    again = parse({"model": MODEL_ID, "messages": ASK, "tools": [dict(WEATHER)]}).add.tools
    assert json.dumps(add.tools) == json.dumps(again)  # same body, same rendering


def ready(dialect: str) -> Ready:
    return Ready(protocol_version=1, model_id="m", context_length=2048, max_num_seqs=4, prefill_chunk_tokens=512,
                 block_tokens=256, dtype="float32", device="cpu", blas="x", load_time_s=0.0, weights_bytes=0,
                 tool_dialect=dialect)


@pytest.mark.parametrize("tool_choice, choice", [
    ("required", REQUIRED), ({"type": "function", "function": {"name": "get_weather"}}, FUNCTION),
    ({"type": "function", "name": "get_weather"}, FUNCTION),  # the Responses API's flat shape
])
@pytest.mark.parametrize("dialect", [HERMES, LLAMA3_JSON, MLXD])
def test_a_forced_call_gets_the_grammar_of_the_model_dialect(tool_choice: Any, choice: str, dialect: str) -> None:
    parsed = parse({"model": MODEL_ID, "messages": ASK, "tools": [WEATHER], "tool_choice": tool_choice})
    assert isinstance(parsed, ChatRequest) and parsed.tools is not None and parsed.tools.choice == choice
    assert parsed.add.constraint is None  # the dialect is not known before the worker is
    bound = bind(parsed, ready(dialect))
    assert isinstance(bound, ChatRequest) and bound.tool_dialect == dialect
    assert bound.add.constraint is not None and bound.add.constraint.kind == "lark"
    assert '"const": "get_weather"' in bound.add.constraint.source
    assert ('"parameters"' if dialect == LLAMA3_JSON else "<tool_call>") in bound.add.constraint.source


def test_auto_gets_the_lazy_call_grammar_and_an_unknown_dialect_reads_as_the_fallback() -> None:
    parsed = parse({"model": MODEL_ID, "messages": ASK, "tools": [WEATHER]})
    bound = bind(parsed, ready("some_future_dialect"))
    assert isinstance(bound, ChatRequest) and bound.tool_dialect == MLXD
    constraint = bound.add.constraint
    assert constraint is not None and constraint.lazy and constraint.triggers == ["<tool_call>"]
    assert constraint.rearm and '"\\"get_weather\\""' in constraint.source


@pytest.mark.parametrize(("dialect", "markers", "arguments"), [
    (HERMES, [], "arguments"), (LLAMA3_JSON, ["<|python_tag|>"], "parameters"),
    (MISTRAL, ["[TOOL_CALLS]"], "arguments"), (MLXD, [], "arguments")])
def test_every_dialect_gets_a_lazy_grammar_in_its_own_syntax(dialect: str, markers: list[str], arguments: str) -> None:
    bound = bind(parse({"model": MODEL_ID, "messages": ASK, "tools": [WEATHER], "parallel_tool_calls": False}),
                 ready(dialect))
    constraint = bound.add.constraint
    assert constraint is not None and constraint.lazy and constraint.markers == markers
    assert f'"\\"{arguments}\\""' in constraint.source and not constraint.rearm


def test_auto_with_a_response_format_keeps_the_format() -> None:
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    bound = bind(parse({"model": MODEL_ID, "messages": ASK, "tools": [WEATHER], "response_format": schema}),
                 ready(HERMES))
    assert bound.add.constraint is not None and not bound.add.constraint.lazy


def test_keywords_the_engine_lacks_are_dropped_and_a_schema_it_cannot_read_allows_any_object() -> None:
    """Claude Code's AskUserQuestion has `propertyNames`: the other tools stay held."""
    odd = {"type": "function", "function": {"name": "odd", "parameters": {
        "type": "object", "properties": {"propertyNames": {"type": "string"},
                                         "answers": {"type": "object", "propertyNames": {"type": "string"}},
                                         "tags": {"type": "array", "uniqueItems": True}}}}}
    broken = {"type": "function", "function": {"name": "broken", "parameters": {
        "type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}}
    bound = bind(parse({"model": MODEL_ID, "messages": ASK, "tools": [odd, broken, WEATHER]}), ready(HERMES))
    source = bound.add.constraint.source
    assert '"propertyNames": {"type": "string"}' in source  # a property of that name stays
    assert source.count("propertyNames") == 1 and "uniqueItems" not in source
    assert 'args1: %json{"type": "object", "x-guidance"' in source and '"city"' in source
