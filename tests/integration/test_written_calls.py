"""Calls written as text and repeated calls (issue 33 parts 3 and 4) on the real service
with the default model (SmolLM2, mlxd's fallback dialect), through the official SDKs. A
135M model does not write a call on cue, so real mechanisms drive the answer: a
`response_format` JSON schema with `tool_choice` auto makes it write a bare call object
(a call written as text: read only if its arguments fit the tool's schema), and a
named `tool_choice` on a tool whose schema allows one city makes it repeat the call whose
result ends the conversation."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from tests.integration.service import Service

pytestmark = pytest.mark.timeout(600)

UNITS = {"type": "string", "enum": ["celsius", "fahrenheit"]}
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris"]}, "unit": UNITS},
                  "required": ["city", "unit"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                            "parameters": WEATHER_SCHEMA}}
# a schema that allows one call only: a forced call repeats the one in the history
ONE_CALL = {**WEATHER_SCHEMA, "properties": {"city": {"type": "string", "enum": ["Paris"]},
                                             "unit": {"const": "celsius"}}}
CALLED = {"city": "Paris", "unit": "celsius"}
ASK = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


def call_format(unit: dict[str, Any]) -> dict[str, Any]:
    """A response_format whose only answer is a bare get_weather call object; `unit` is
    its arguments' unit schema (one the tool's own allows, or one it does not)."""
    arguments = {"type": "object", "properties": {"city": {"const": "Paris"}, "unit": unit},
                 "required": ["city", "unit"], "additionalProperties": False}
    schema = {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": arguments},
              "required": ["name", "arguments"], "additionalProperties": False}
    return {"type": "json_schema", "json_schema": {"name": "call", "schema": schema}}


@pytest.fixture(scope="module")
def openai_client(service: Service) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{service.base_url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_a_bare_call_object_is_read_as_a_call_when_its_arguments_fit(openai_client: openai.OpenAI,
                                                                     model_id: str, service: Service) -> None:
    mark = service.log_mark()
    response = openai_client.chat.completions.create(
        model=model_id, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=80,
        response_format=call_format({"const": "celsius"}))  # type: ignore[arg-type]
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather",
                                                                         {"city": "Paris", "unit": "celsius"})
    assert response.model_extra["mlxd"]["tool_calls"] == {"recovered_from_text": 1, "repeated": []}
    service.wait_for_log("read a call to 'get_weather' written as text", after=mark)


def test_one_whose_arguments_break_the_schema_stays_text(openai_client: openai.OpenAI, model_id: str) -> None:
    response = openai_client.chat.completions.create(
        model=model_id, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=80,
        response_format=call_format({"const": "kelvin"}))  # type: ignore[arg-type]
    choice = response.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason == "stop"
    assert json.loads(choice.message.content)["arguments"]["unit"] == "kelvin"
    assert response.model_extra["mlxd"]["tool_calls"] == {"recovered_from_text": 0, "repeated": []}


def test_streamed_it_is_the_same_call(openai_client: openai.OpenAI, model_id: str) -> None:
    chunks = list(openai_client.chat.completions.create(
        model=model_id, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=80, stream=True,
        response_format=call_format({"const": "celsius"})))  # type: ignore[arg-type]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    arguments = "".join(d.function.arguments or "" for c in chunks if c.choices
                        for d in c.choices[0].delta.tool_calls or [])
    assert text == "" and json.loads(arguments) == {"city": "Paris", "unit": "celsius"}
    assert chunks[-1].model_extra["mlxd"]["tool_calls"]["recovered_from_text"] == 1


def test_responses_reads_it_too(openai_client: openai.OpenAI, model_id: str) -> None:
    fmt = call_format({"const": "celsius"})["json_schema"]
    response = openai_client.responses.create(
        model=model_id, input=ASK[0]["content"], temperature=0, max_output_tokens=80,
        tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER_SCHEMA}],  # type: ignore[list-item]
        text={"format": {"type": "json_schema", **fmt}})  # type: ignore[typeddict-item]
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert json.loads(call.arguments) == {"city": "Paris", "unit": "celsius"}
    assert response.model_extra["mlxd"]["tool_calls"] == {"recovered_from_text": 1, "repeated": []}


def test_a_repeated_call_is_reported_not_changed_through_the_anthropic_sdk(service: Service, model_id: str) -> None:
    client = anthropic.Anthropic(base_url=service.base_url, api_key="unused", max_retries=0, timeout=300)
    mark = service.log_mark()
    tool = {"name": "get_weather", "description": "Weather in a city.", "input_schema": ONE_CALL}
    message = client.messages.create(
        model=model_id, max_tokens=80, tools=[tool],  # type: ignore[list-item]
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "What is the weather in Paris, in celsius?"},
                  {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_first", "name": "get_weather",
                                                     "input": CALLED}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_first",
                                                "content": "18 degrees, sunny"},
                                               {"type": "text", "text": "Answer in celsius."}]}])
    (use,) = [block for block in message.content if block.type == "tool_use"]
    assert use.input == CALLED  # unchanged, not dropped
    assert message.model_extra["mlxd"]["tool_calls"] == {
        "recovered_from_text": 0, "repeated": [{"index": 0, "name": "get_weather", "of_call_id": "toolu_first"}]}
    service.wait_for_log("repeats 'get_weather' of toolu_first", after=mark)


def test_and_through_the_openai_sdk(openai_client: openai.OpenAI, model_id: str) -> None:
    tool = {"type": "function", "function": {**WEATHER["function"], "parameters": ONE_CALL}}
    response = openai_client.chat.completions.create(
        model=model_id, temperature=0, max_tokens=80, tools=[tool],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        messages=[*ASK, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_first", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps(CALLED)}}]},
            {"role": "tool", "tool_call_id": "call_first", "content": "18 degrees, sunny"}])
    (call,) = response.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == CALLED  # unchanged, not dropped
    assert response.model_extra["mlxd"]["tool_calls"] == {
        "recovered_from_text": 0, "repeated": [{"index": 0, "name": "get_weather", "of_call_id": "call_first"}]}
