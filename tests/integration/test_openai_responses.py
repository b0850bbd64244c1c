"""POST /v1/responses on the real service with the default model, SmolLM2, through the
official openai SDK (`responses.create`, `responses.stream`) and Codex's captured body."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.integration.service import Service, running_service
from tests.integration.test_anthropic_messages import shortened

pytestmark = pytest.mark.timeout(900)

CLIENTS = Path(__file__).resolve().parents[1] / "clients"  # request bodies captured from the real clients
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER = {"type": "function", "name": "get_weather", "description": "Get the current weather in a city.",
           "parameters": WEATHER_SCHEMA, "strict": True}
# long enough that the first turn's prompt fills a whole cache block (256 tokens) by itself
INSTRUCTIONS = "You are a weather assistant for travellers. " * 14
FRANCE = "What is the capital of France?"
CODEX_MODEL = "qwen3-coder-30b"  # the name Codex was configured with when its body was captured


@pytest.fixture(scope="module")
def service(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """The service with a small output cap (replayed bodies end in seconds), keep-alives
    every second (the replayed prefills show them) and Codex's model name served by the
    default model, through `model_aliases`."""
    with running_service(["--model", str(default_model_dir), "--max-output-tokens", "40", "--sse-keepalive-s", "1",
                         "--model-aliases", f"{CODEX_MODEL}=<default>"], tmp_path_factory.mktemp("home")) as svc:
        yield svc


@pytest.fixture(scope="module")
def client(service: Service) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{service.base_url}/v1", api_key="unused", max_retries=0, timeout=600)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_text_answer(client: openai.OpenAI, model: str) -> None:
    response = client.responses.create(model=model, input=FRANCE, temperature=0, store=False)
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status == "completed" and response.model == model
    message = response.output[0]
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert "Paris" in response.output_text
    assert response.usage.input_tokens > 5 and response.usage.output_tokens > 0
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens


def test_an_answer_cut_at_max_output_tokens_is_incomplete(client: openai.OpenAI, model: str) -> None:
    response = client.responses.create(model=model, input="Tell me a long story about a dragon.",
                                       max_output_tokens=3, store=False)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 3 and response.output_text


def test_stream_event_sequence(client: openai.OpenAI, model: str) -> None:
    with client.responses.stream(model=model, input=FRANCE, temperature=0, store=False) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [event.sequence_number for event in events] == list(range(len(events)))
    # a prefill longer than the keep-alive interval repeats response.in_progress before the output
    types = [event.type for i, event in enumerate(events) if i < 2 or event.type != "response.in_progress"]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert deltas == final.output_text and "Paris" in deltas
    assert events[0].response.status == "in_progress" and final.status == "completed"
    assert final.usage.input_tokens_details.cached_tokens >= 0


def test_stream_of_a_cut_answer_ends_with_response_incomplete(service: Service, model: str) -> None:
    body = {"model": model, "input": "Tell me a long story about a dragon.", "stream": True,
            "max_output_tokens": 4, "store": False}
    events = named_events(service, body)
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert events[-2]["item"]["status"] == "incomplete"


def test_a_forced_function_call_matches_its_schema(client: openai.OpenAI, model: str) -> None:
    response = client.responses.create(model=model, input="What is the weather in Paris?", tools=[WEATHER],
                                       tool_choice={"type": "function", "name": "get_weather"}, temperature=0,
                                       store=False)
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1, response.output
    call = calls[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER_SCHEMA)
    assert response.tools[0].name == "get_weather"


def test_a_streamed_forced_call_sends_its_argument_events(client: openai.OpenAI, model: str) -> None:
    with client.responses.stream(model=model, input="What is the weather in Paris?", tools=[WEATHER],
                                 tool_choice="required", temperature=0, store=False) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [event.type for event in events]
    assert "response.function_call_arguments.delta" in types and "response.function_call_arguments.done" in types
    done = next(event for event in events if event.type == "response.function_call_arguments.done")
    call = next(item for item in final.output if item.type == "function_call")
    assert done.arguments == call.arguments
    jsonschema.validate(json.loads(call.arguments), WEATHER_SCHEMA)
    assert types[-1] == "response.completed"


def test_a_call_and_its_output_round_trip_and_hit_the_prefix_cache(client: openai.OpenAI, model: str) -> None:
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.responses.create(model=model, instructions=INSTRUCTIONS, input=asked, tools=[WEATHER],
                                    tool_choice={"type": "function", "name": "get_weather"}, temperature=0,
                                    store=False)
    assert first.usage.input_tokens >= 256  # the first turn fills a cache block by itself
    call = next(item for item in first.output if item.type == "function_call")
    replay = [*asked, {"type": "function_call", "call_id": call.call_id, "name": call.name,
                       "arguments": call.arguments, "id": call.id, "status": "completed"},
              {"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees Celsius and sunny"}]
    second = client.responses.create(model=model, instructions=INSTRUCTIONS, input=replay, tools=[WEATHER],
                                     temperature=0, max_output_tokens=20, store=False)
    assert second.status in ("completed", "incomplete")
    assert second.usage.input_tokens > first.usage.input_tokens
    assert second.usage.input_tokens_details.cached_tokens > 0


def test_previous_response_id_continues_a_stored_response(client: openai.OpenAI, model: str) -> None:
    first = client.responses.create(model=model, input=FRANCE, temperature=0)  # store defaults to true
    second = client.responses.create(model=model, input="And of Italy?", previous_response_id=first.id,
                                     temperature=0, max_output_tokens=12)
    alone = client.responses.create(model=model, input="And of Italy?", temperature=0, max_output_tokens=12,
                                    store=False)
    # the second turn's prompt holds the first turn (its question and answer)
    assert second.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens
    assert second.previous_response_id == first.id
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model=model, input="Hi", previous_response_id=alone.id)  # not stored
    assert raised.value.body["code"] == "previous_response_not_found"
    assert raised.value.body["param"] == "previous_response_id"


def test_text_format_json_schema_parses(client: openai.OpenAI, model: str) -> None:
    schema = {"type": "object", "properties": {"capital": {"type": "string", "enum": ["Paris", "Rome"]}},
              "required": ["capital"], "additionalProperties": False}
    response = client.responses.create(model=model, input=FRANCE, temperature=0, store=False,
                                       text={"format": {"type": "json_schema", "name": "answer", "schema": schema,
                                                        "strict": True}})
    jsonschema.validate(json.loads(response.output_text), schema)
    assert response.text.format.type == "json_schema"


def test_a_bad_schema_is_refused_naming_text_format(client: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model=model, input="Hi", text={"format": {"type": "yaml"}})
    assert raised.value.body["param"] == "text"


def named_events(service: Service, body: dict[str, Any], headers: dict[str, str] | None = None) -> list[Any]:
    """The SSE stream's events, each checked to be framed as `event: <type>` + `data:`
    (no comments: Codex's idle timeout does not count them); `_at` is when each arrived."""
    events, name, started = [], None, time.monotonic()
    with httpx.stream("POST", f"{service.base_url}/v1/responses", json=body, headers=headers, timeout=600) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers.get("content-encoding") in (None, "gzip", "identity")
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                assert event["type"] == name
                events.append({**event, "_at": time.monotonic() - started})
            else:
                assert line == "", line
    return events


def test_codex_first_turn_is_served(service: Service) -> None:
    """Codex's body and headers exactly as sent (its model name reaches the default model
    through `model_aliases`; namespace and web_search tools, developer items, store:
    false): a 200 and a well-formed, uncompressed stream."""
    recorded = json.loads((CLIENTS / "codex-cli-responses-first-turn.json").read_text())
    assert recorded["body"]["model"] == CODEX_MODEL
    headers = {k: v for k, v in recorded["headers"].items() if k.lower() not in ("authorization", "content-length")}
    assert headers["accept-encoding"] == "zstd,gzip"
    events = named_events(service, shortened(recorded["body"]), headers)  # the shapes as sent, prefilled in seconds
    assert events[0]["type"] == "response.created" and events[1]["type"] == "response.in_progress"
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    first_item = next(e["_at"] for e in events if e["type"] == "response.output_item.added")
    keepalives = [e for e in events[2:] if e["type"] == "response.in_progress"]
    assert all(e["response"]["status"] == "in_progress" and not e["response"]["output"] for e in keepalives)
    if first_item > 3.0:  # a prefill of seconds: a keep-alive event every second of it
        assert len(keepalives) >= 1, [(e["type"], e["_at"]) for e in events[:5]]
    final = events[-1]["response"]
    assert final["model"] == CODEX_MODEL and final["store"] is False and final["output"]
    assert final["usage"]["input_tokens"] > 1000  # the developer items and all twelve functions are in the prompt
    names = [tool["name"] for tool in final["tools"]]
    assert "exec_command" in names and "multi_agent_v1" in names and "web_search" not in str(final["tools"])
    added = [event["item"]["id"] for event in events if event["type"] == "response.output_item.added"]
    finished = [event["item"]["id"] for event in events if event["type"] == "response.output_item.done"]
    assert added == finished == [item["id"] for item in final["output"]]


def test_a_whole_answer_with_codex_accept_encoding_is_not_compressed(service: Service, model: str) -> None:
    response = httpx.post(f"{service.base_url}/v1/responses", headers={"accept-encoding": "zstd,gzip"},
                          json={"model": model, "input": FRANCE, "temperature": 0, "store": False}, timeout=600)
    assert response.status_code == 200
    assert response.headers.get("content-encoding") in (None, "gzip", "identity")
    assert response.json()["status"] == "completed"
