"""Tool calls on the real service with the default model, SmolLM2, whose template has no
tools: mlxd renders them in its fallback dialect, a named tool_choice is enforced by the
grammar engine, and the real clients' tool bodies are served."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.integration.service import Service, running_service

pytestmark = pytest.mark.timeout(900)

CLIENTS = Path(__file__).resolve().parents[1] / "clients"  # request bodies captured from the real clients
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "City name"},
                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city.",
                                            "parameters": WEATHER_SCHEMA}}
READ_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
READ = {"type": "function", "function": {"name": "read_file", "description": "Read a text file.",
                                         "parameters": READ_SCHEMA}}
# long enough that the first turn's prompt fills a whole cache block (256 tokens) by itself
SYSTEM = {"role": "system", "content": "You are a weather assistant for travellers. " * 12}
ASK = [SYSTEM, {"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def tool_service(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """The service with a small output cap, so that replayed client bodies (max_tokens
    32000, or none) end in seconds: the cap clamps, it never refuses."""
    with running_service(["--model", str(default_model_dir), "--max-output-tokens", "48"],
                         tmp_path_factory.mktemp("home")) as svc:
        yield svc


@pytest.fixture(scope="module")
def client(tool_service: Service) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tool_service.base_url}/v1", api_key="unused", max_retries=0, timeout=600)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_the_worker_reports_the_fallback_dialect_and_tools_reach_the_prompt(client: openai.OpenAI, model: str,
                                                                           tool_service: Service) -> None:
    plain = client.chat.completions.create(model=model, messages=ASK, max_tokens=1)
    tooled = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], max_tokens=1)
    none = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice="none",
                                          max_tokens=1)
    # the tools block (instructions and the function's JSON) is in the prompt, unless "none"
    assert tooled.usage.prompt_tokens > plain.usage.prompt_tokens + 60
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens
    assert "tool calls in the mlxd dialect" in tool_service.log_text()


def test_a_named_tool_choice_returns_a_call_whose_arguments_match_the_schema(client: openai.OpenAI,
                                                                            model: str) -> None:
    response = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, READ], tool_choice=NAMED,
                                              temperature=0)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_SCHEMA)


def test_streamed_deltas_reassemble_exactly_to_the_non_streamed_call(client: openai.OpenAI, model: str) -> None:
    whole = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice=NAMED,
                                           temperature=0).choices[0].message.tool_calls[0]
    chunks = list(client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice=NAMED,
                                                 temperature=0, stream=True, stream_options={"include_usage": True}))
    name, arguments, content, finish, first = None, "", "", None, None
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                assert delta.index == 0
                if first is None:
                    first = delta
                    name = delta.function.name
                arguments += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    assert first is not None and first.id.startswith("call_") and first.type == "function"
    assert (name, arguments) == (whole.function.name, whole.function.arguments)
    assert content == "" and finish == "tool_calls"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_required_returns_one_call_of_an_offered_function(client: openai.OpenAI, model: str) -> None:
    choice = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, READ], tool_choice="required",
                                            temperature=0).choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    schema = {"get_weather": WEATHER_SCHEMA, "read_file": READ_SCHEMA}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), schema)


def test_a_second_turn_sees_its_call_and_the_result_and_hits_the_prefix_cache(client: openai.OpenAI,
                                                                              model: str) -> None:
    first = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice=NAMED,
                                           temperature=0)
    call = first.choices[0].message.tool_calls[0]
    second_turn = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                   {"role": "tool", "tool_call_id": call.id, "content": "18 degrees Celsius and sunny"}]
    second = client.chat.completions.create(model=model, messages=second_turn, tools=[WEATHER], temperature=0,
                                            max_tokens=30)
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + first.usage.completion_tokens // 2
    assert second.usage.prompt_tokens_details.cached_tokens > 0
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")


def sse_events(response: httpx.Response) -> list[Any]:
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            events.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
        else:
            assert line == "" or line.startswith(":"), line
    return events


@pytest.mark.parametrize("capture", [
    "openai-python-chat-stream-tools-include-usage", "opencode-chat-tool-roundtrip",
    "langchain-chatopenai-stream-bind-tools", "aider-chat-stream-whole-format",
])
def test_real_clients_tool_bodies_are_served(tool_service: Service, model: str, capture: str) -> None:
    """Each body exactly as its client sent it, but for the model name (theirs is not
    served here): a 200 and a well-formed chunk stream."""
    recorded = json.loads((CLIENTS / f"{capture}.json").read_text())
    body = {**recorded["body"], "model": model}
    headers = {k: v for k, v in recorded["headers"].items() if k.lower() not in ("content-length", "host")}
    with httpx.stream("POST", tool_service.base_url + recorded["path"], json=body, headers=headers,
                      timeout=600) as response:
        assert response.status_code == 200, response.read()
        events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == model for c in chunks)
    finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
    assert len(finishes) == 1 and finishes[0] in ("stop", "length", "tool_calls")
    if (body.get("stream_options") or {}).get("include_usage"):
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    else:
        assert all(c["choices"] for c in chunks)
    seen: set[int] = set()
    for delta in (ch["delta"] for c in chunks for ch in c["choices"]):
        for call in delta.get("tool_calls", []):
            if call["index"] not in seen:
                seen.add(call["index"])
                assert call["id"].startswith("call_") and call["type"] == "function"
                assert call["function"]["name"] in {t["function"]["name"] for t in body["tools"]}


@pytest.mark.parametrize("capture", [
    "openai-python-chat-logprobs-developer-json-object", "openai-python-chat-parse-json-schema",
])
def test_real_clients_whole_answer_bodies_are_served(tool_service: Service, model: str, capture: str) -> None:
    """The SDK's non-streamed shapes, exactly as sent but for the model name: logprobs with
    a developer message and json_object, and parse()'s strict json_schema."""
    recorded = json.loads((CLIENTS / f"{capture}.json").read_text())
    body = {**recorded["body"], "model": model}
    headers = {k: v for k, v in recorded["headers"].items()
               if k.lower() not in ("content-length", "host", "accept-encoding")}
    response = httpx.post(tool_service.base_url + recorded["path"], json=body, headers=headers, timeout=600)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["object"] == "chat.completion" and answer["model"] == model
    (choice,) = answer["choices"]
    content = choice["message"]["content"]
    if choice["finish_reason"] == "stop":  # constrained to JSON: whole answers parse
        assert isinstance(json.loads(content), dict)
    if body.get("logprobs"):
        tokens = choice["logprobs"]["content"]
        assert len(tokens) == answer["usage"]["completion_tokens"]
        assert all(len(t["top_logprobs"]) == body["top_logprobs"] and t["logprob"] <= 0 for t in tokens)
