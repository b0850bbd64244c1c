"""Repeated calls (issue 33 part 4) and the `mlxd.tool_calls` block of every API: an
answer's call equal to one whose result the request just brought is reported, not
changed; a call read from text is counted. Through the real router in front of the fake
worker, whose answer to a last message "TOOLCALL" calls get_weather for Paris and Rome,
and to "WRITTENCALL" writes `# get_weather` and Paris's arguments as text."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from router.api.anthropic_messages import parse as parse_anthropic
from router.api.openai_chat import parse as parse_chat
from router.api.openai_responses import parse as parse_responses
from router.api.response_store import ResponseStore
from router.model_settings import ModelSettings
from router.profiles import Profile
from router.tool_calls.repeats import AnsweredCall, last_results, repeated_calls
from tests.router.router_harness import MODEL_ID, RunningRouter, start_router

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]
PARIS_CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
REPEAT = {"index": 0, "name": "get_weather", "of_call_id": "call_1"}


def chat_body(last: str = "TOOLCALL", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL_ID, "tools": CHAT_TOOLS, **extra, "messages": [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [PARIS_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": last}]}


def anthropic_body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL_ID, "max_tokens": 64, **extra,
            "tools": [{"name": "get_weather", "input_schema": SCHEMA}],
            "messages": [{"role": "user", "content": "weather in Paris?"},
                         {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                            "input": {"city": "Paris"}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                       "content": "sunny"},
                                                      {"type": "text", "text": "TOOLCALL (the fake worker's cue)"}]}]}


def responses_body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL_ID, **extra, "tools": [{"type": "function", "name": "get_weather", "parameters": SCHEMA}],
            "input": [{"role": "user", "content": "weather in Paris?"},
                      {"type": "function_call", "call_id": "fc_call_1", "name": "get_weather",
                       "arguments": '{"city": "Paris"}'},
                      {"type": "function_call_output", "call_id": "fc_call_1", "output": "TOOLCALL"}]}


def test_the_last_results_in_every_api_point_at_their_calls() -> None:
    paris = AnsweredCall("call_1", "get_weather", {"city": "Paris"})
    assert last_results(parse_chat(chat_body()).add.messages) == [paris]
    # Anthropic: the user turn with the result ends with text, a user message of its own
    assert last_results(parse_anthropic(anthropic_body()).add.messages) == [
        AnsweredCall("toolu_1", "get_weather", {"city": "Paris"})]
    assert last_results(parse_responses(responses_body(), store=ResponseStore()).add.messages) == [
        AnsweredCall("fc_call_1", "get_weather", {"city": "Paris"})]
    answered_then_asked = [*parse_chat(chat_body()).add.messages, {"role": "assistant", "content": "Sunny."},
                           {"role": "user", "content": "and Rome?"}]
    assert last_results(answered_then_asked) == []


def test_a_repeat_is_equal_json_not_equal_text() -> None:
    answered = [AnsweredCall("call_1", "get_weather", {"city": "Paris", "unit": "c"})]
    calls = [("get_weather", {"unit": "c", "city": "Paris"}), ("get_weather", {"city": "Paris"}),
             ("get_time", {"city": "Paris", "unit": "c"})]
    assert repeated_calls(calls, answered, "req") == [{"index": 0, "name": "get_weather", "of_call_id": "call_1"}]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningRouter]:
    """One router for the module, whose profile `fake-model:strict` turns recovery off."""
    model_dir = tmp_path_factory.mktemp("models") / MODEL_ID
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    with pytest.MonkeyPatch.context() as monkeypatch:
        yield from start_router(model_dir, monkeypatch,
                                profiles={f"{MODEL_ID}:strict": Profile(tool_text_recovery=False)})


def post(router: RunningRouter, path: str, body: dict[str, Any]) -> dict[str, Any]:
    with router.client() as client:
        response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def stream_events(router: RunningRouter, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with router.client() as client, client.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200
        lines = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def test_chat_reports_the_repeat_and_keeps_the_call(shared: RunningRouter) -> None:
    body = post(shared, "/v1/chat/completions", chat_body())
    assert [c["function"]["arguments"] for c in body["choices"][0]["message"]["tool_calls"]] == [
        '{"city": "Paris"}', '{"city": "Rome"}']
    assert body["mlxd"]["tool_calls"] == {"recovered_from_text": 0, "repeated": [REPEAT]}
    last = stream_events(shared, "/v1/chat/completions", chat_body())[-1]
    assert last["mlxd"]["tool_calls"] == {"recovered_from_text": 0, "repeated": [REPEAT]}


def test_chat_reads_a_call_written_as_text_unless_the_profile_says_not(shared: RunningRouter) -> None:
    message = post(shared, "/v1/chat/completions", chat_body("WRITTENCALL"))
    assert message["choices"][0]["message"]["tool_calls"][0]["function"] == {
        "name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert message["choices"][0]["finish_reason"] == "tool_calls"
    assert message["mlxd"]["tool_calls"] == {"recovered_from_text": 1, "repeated": [REPEAT]}
    strict = post(shared, "/v1/chat/completions", chat_body("WRITTENCALL", model=f"{MODEL_ID}:strict"))
    assert strict["choices"][0]["message"]["content"] == '# get_weather\n{"city": "Paris"}'
    assert strict["mlxd"]["tool_calls"] == {"recovered_from_text": 0, "repeated": []}


def test_without_tools_there_is_no_report(shared: RunningRouter) -> None:
    body = post(shared, "/v1/chat/completions", {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}]})
    assert "tool_calls" not in body["mlxd"]
    assert "mlxd" not in post(shared, "/v1/messages", {"model": MODEL_ID, "max_tokens": 8,
                                                       "messages": [{"role": "user", "content": "hi"}]})


def test_anthropic_reports_the_repeat_whole_and_streamed(shared: RunningRouter) -> None:
    body = post(shared, "/v1/messages", anthropic_body())
    assert [b["input"] for b in body["content"] if b["type"] == "tool_use"] == [{"city": "Paris"}, {"city": "Rome"}]
    assert body["mlxd"] == {"tool_calls": {"recovered_from_text": 0, "repeated": [{**REPEAT, "of_call_id": "toolu_1"}]}}
    delta = next(e for e in stream_events(shared, "/v1/messages", anthropic_body()) if e["type"] == "message_delta")
    assert delta["mlxd"] == body["mlxd"]


def test_responses_reports_the_repeat_whole_and_streamed(shared: RunningRouter) -> None:
    body = post(shared, "/v1/responses", responses_body())
    assert [i["arguments"] for i in body["output"] if i["type"] == "function_call"] == [
        '{"city": "Paris"}', '{"city": "Rome"}']
    assert body["mlxd"] == {"tool_calls": {"recovered_from_text": 0,
                                           "repeated": [{**REPEAT, "of_call_id": "fc_call_1"}]}}
    done = stream_events(shared, "/v1/responses", responses_body())[-1]
    assert done["type"] == "response.completed" and done["response"]["mlxd"] == body["mlxd"]


def test_a_model_switch_turns_recovery_off(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for router in start_router(model_dir, monkeypatch, models={MODEL_ID: ModelSettings(tool_text_recovery=False)}):
        body = post(router, "/v1/chat/completions", chat_body("WRITTENCALL"))
        assert body["choices"][0]["message"]["content"] == '# get_weather\n{"city": "Paris"}'
        assert body["mlxd"]["tool_calls"]["recovered_from_text"] == 0


def test_the_switch_is_a_config_key_per_model_and_profile() -> None:
    """Declared once each, with a help string, in the settings the config file is read into."""
    model_field = {f.name: f for f in dataclasses.fields(ModelSettings)}["tool_text_recovery"]
    profile_field = {f.name: f for f in dataclasses.fields(Profile)}["tool_text_recovery"]
    assert model_field.default is True and profile_field.default is None
    assert model_field.metadata and profile_field.metadata

