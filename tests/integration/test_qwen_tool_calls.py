"""Tool calls on Qwen2.5-Coder-0.5B-Instruct, whose own template renders tools (the Hermes
dialect): the model decides to call (`tool_choice: "auto"`), and a full round trip. Few
and short: it decodes several times slower than SmolLM2 on a CPU."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageFunctionToolCall as ToolCall

from tests.integration.service import Service, running_service

pytestmark = pytest.mark.timeout(900)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"}},
                   "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def qwen(qwen_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[openai.OpenAI, Service]]:
    with running_service(["--model", str(qwen_model_dir)], tmp_path_factory.mktemp("home")) as svc:
        yield openai.OpenAI(base_url=f"{svc.base_url}/v1", api_key="unused", max_retries=0, timeout=600), svc


@pytest.fixture(scope="module")
def first_call(qwen: tuple[openai.OpenAI, Service]) -> ToolCall:
    client, _ = qwen
    choice = client.chat.completions.create(model="qwen2.5-coder-0.5b", messages=ASK, tools=[WEATHER],
                                            tool_choice="auto", temperature=0, max_tokens=60).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    return call


def test_auto_calls_the_weather_tool_the_same_streamed_or_not(qwen: tuple[openai.OpenAI, Service],
                                                              first_call: ToolCall) -> None:
    client, service = qwen
    assert "tool calls in the hermes dialect" in service.log_text()
    assert first_call.function.name == "get_weather"
    assert json.loads(first_call.function.arguments) == {"city": "Paris"}
    stream = client.chat.completions.create(model="qwen2.5-coder-0.5b", messages=ASK, tools=[WEATHER],
                                            tool_choice="auto", temperature=0, max_tokens=60, stream=True)
    name, arguments, content, finish = None, "", "", None
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                name = name or delta.function.name
                arguments += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    assert (name, arguments, content, finish) == ("get_weather", first_call.function.arguments, "", "tool_calls")
