"""POST /v1/messages on the real service with the default model, SmolLM2, through the
official `anthropic` SDK and as raw SSE: text and tool answers streamed and whole, the exact
event sequence, prefill, Anthropic's error shapes, the billing line kept out of the prefix
cache, and every captured Claude Code / anthropic-python body replayed."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest

from router.config import RouterConfig
from tests.integration.service import Service, running_service

pytestmark = pytest.mark.timeout(1200)

CLIENTS = Path(__file__).resolve().parents[1] / "clients"  # request bodies captured from the real clients
KEEPALIVE_S = 2.0  # short, so the replays' prefills show their pings
BLOCK_TOKENS = 256  # the service's default cache block
ASK = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER = {"name": "get_weather", "description": "Get the current weather in a city.", "input_schema": WEATHER_SCHEMA}
READ = {"name": "read_file", "description": "Read a text file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
# long enough to fill a whole cache block (256 tokens) by itself
# this SDK has no sampling parameters (the API still reads them): greedy, for answers to compare
GREEDY = {"extra_body": {"temperature": 0}}
LONG_SYSTEM = "You are a careful assistant for travellers who answers in one short sentence. " * 24
BLOCK_EVENTS = ("content_block_start", "content_block_delta", "content_block_stop")
# glob aliases (claude-* -> the served model) let replays keep the captured model names
HAS_MODEL_ALIASES = any(f.name == "model_aliases" for f in dataclasses.fields(RouterConfig))


@pytest.fixture(scope="module")
def service(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """One service for the module; a small output cap so replayed bodies (max_tokens 128000)
    end in seconds: the cap clamps, it never refuses."""
    with running_service(["--model", str(default_model_dir), "--max-output-tokens", "48",
                         "--sse-keepalive-s", str(KEEPALIVE_S)], tmp_path_factory.mktemp("home")) as svc:
        yield svc


@pytest.fixture(scope="module")
def client(service: Service) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=service.base_url, api_key="unused", max_retries=0, timeout=600)


@pytest.fixture(scope="module")
def model(service: Service) -> str:
    return httpx.get(f"{service.base_url}/v1/models", timeout=10).json()["data"][0]["id"]


def sse_events(response: httpx.Response) -> list[dict[str, Any]]:
    """The events of an Anthropic stream; each `event:` name must equal its data's type."""
    events, name = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            data = json.loads(line[len("data: "):])
            assert data["type"] == name, (name, data)
            events.append(data)
            name = None
        else:
            assert line == "", line
    return events


def check_sequence(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assert the documented order (pings anywhere) and return the content it builds."""
    events = [e for e in events if e["type"] != "ping"]
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop", events
    start = events[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["role"] == "assistant"
    assert start["id"].startswith("msg_")
    assert events[-2]["type"] == "message_delta", events[-2]
    content: list[dict[str, Any]] = []
    open_index = None
    for event in events[1:-2]:
        assert event["type"] in BLOCK_EVENTS, event
        if event["type"] == "content_block_start":
            assert open_index is None and event["index"] == len(content)
            block = event["content_block"]
            assert block in ({"type": "text", "text": ""}, {**block, "type": "tool_use", "input": {}}), block
            content.append({**block, "partial": ""})
            open_index = event["index"]
        elif event["type"] == "content_block_delta":
            assert event["index"] == open_index
            delta, block = event["delta"], content[open_index]
            if block["type"] == "text":
                assert delta["type"] == "text_delta"
                block["text"] += delta["text"]
            else:
                assert delta["type"] == "input_json_delta"
                block["partial"] += delta["partial_json"]
        else:
            assert event["index"] == open_index
            open_index = None
    assert open_index is None
    for block in content:
        if block["type"] == "tool_use":
            block["input"] = json.loads(block["partial"])
        del block["partial"]
    usage = events[-2]["usage"]
    assert set(usage) >= {"input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"}
    return content


def stream_raw(service: Service, body: dict[str, Any], path: str = "/v1/messages",
               headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    with httpx.stream("POST", service.base_url + path, json={**body, "stream": True}, headers=headers,
                      timeout=600) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return sse_events(response)


def test_a_text_answer_whole(client: anthropic.Anthropic, model: str) -> None:
    message = client.messages.create(model=model, max_tokens=100000, messages=ASK, **GREEDY)
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == model
    (block,) = message.content
    assert block.type == "text" and "Paris" in block.text, block
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    usage = message.usage
    assert usage.input_tokens + usage.cache_read_input_tokens > 10 and usage.output_tokens > 0
    assert usage.cache_creation_input_tokens == 0


def test_a_text_answer_streamed_in_the_documented_sequence(client: anthropic.Anthropic, service: Service,
                                                           model: str) -> None:
    body = {"model": model, "max_tokens": 4, "messages": ASK}
    events = stream_raw(service, {**body, "temperature": 0})
    content = check_sequence(events)
    assert [block["type"] for block in content] == ["text"]
    delta = next(e for e in events if e["type"] == "message_delta")
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 4
    whole = client.messages.create(**body, **GREEDY)
    assert content[0]["text"] == whole.content[0].text  # greedy: the same answer both ways
    with client.messages.stream(**body, **GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text and final.stop_reason == "max_tokens"


def test_a_stop_sequence_ends_the_answer_and_is_reported(client: anthropic.Anthropic, model: str) -> None:
    message = client.messages.create(model=model, max_tokens=30, messages=ASK, **GREEDY,
                                     stop_sequences=["Paris"])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "Paris"
    assert "Paris" not in message.content[0].text


def test_a_named_tool_choice_returns_tool_use_whose_input_matches_the_schema(client: anthropic.Anthropic,
                                                                            service: Service, model: str) -> None:
    body = {"model": model, "max_tokens": 1000, "tools": [WEATHER, READ],
            "tool_choice": {"type": "tool", "name": "get_weather"},
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}]}
    message = client.messages.create(**body, **GREEDY)
    assert message.stop_reason == "tool_use", message
    (call,) = [block for block in message.content if block.type == "tool_use"]
    assert call.name == "get_weather" and call.id.startswith("toolu_")
    jsonschema.validate(call.input, WEATHER_SCHEMA)
    content = check_sequence(stream_raw(service, {**body, "temperature": 0}))
    (streamed,) = [block for block in content if block["type"] == "tool_use"]
    assert streamed["name"] == "get_weather" and streamed["input"] == call.input


def test_a_string_and_the_same_text_as_blocks_render_the_same(client: anthropic.Anthropic, model: str) -> None:
    def prompt_tokens(system: Any, content: Any) -> int:
        usage = client.messages.create(model=model, max_tokens=1, system=system,
                                       messages=[{"role": "user", "content": content}]).usage
        return usage.input_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens  # the prompt

    as_strings = prompt_tokens("Be brief.", "Name a colour.")
    as_blocks = prompt_tokens([{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
                              [{"type": "text", "text": "Name a colour."}])
    assert as_strings == as_blocks


def test_the_billing_line_does_not_break_the_prefix_cache(client: anthropic.Anthropic, model: str) -> None:
    def ask(nonce: str) -> anthropic.types.Usage:
        system = [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.332.500; "
                                           f"cc_entrypoint=cli; cch={nonce};"},
                  {"type": "text", "text": LONG_SYSTEM}]
        return client.messages.create(model=model, max_tokens=1, system=system, **GREEDY,
                                      messages=[{"role": "user", "content": "Where is Rome?"}]).usage

    first, second = ask("a1b2c"), ask("9f8e7")
    assert first.input_tokens + first.cache_read_input_tokens >= 256
    assert second.cache_read_input_tokens >= 256, second


def test_an_assistant_prefill_is_continued(client: anthropic.Anthropic, model: str) -> None:
    prefill = "The capital of France is"
    message = client.messages.create(model=model, max_tokens=10, **GREEDY,
                                     messages=[*ASK, {"role": "assistant", "content": prefill}])
    text = message.content[0].text
    assert not text.startswith("The capital"), text  # only the continuation comes back
    assert text.strip().startswith("Paris"), text


def test_errors_have_anthropics_shape(client: anthropic.Anthropic, service: Service, model: str) -> None:
    # max_tokens is required, as at Anthropic (the SDK itself refuses to send such a body)
    missing = httpx.post(f"{service.base_url}/v1/messages", json={"model": model, "messages": ASK}, timeout=30)
    assert missing.status_code == 400 and missing.json()["type"] == "error"
    assert missing.json()["error"]["type"] == "invalid_request_error" and "max_tokens" in missing.text
    with pytest.raises(anthropic.NotFoundError) as unknown:
        client.messages.create(model="no-such-model", max_tokens=5, messages=ASK)
    assert unknown.value.body["type"] == "error" and unknown.value.body["error"]["type"] == "not_found_error"
    response = httpx.post(f"{service.base_url}/v1/messages", content=b"{not json", timeout=30,
                          headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"


def test_a_prompt_over_the_context_window_says_prompt_is_too_long(service: Service, model: str) -> None:
    """The whole captured body (17.7K tokens against SmolLM2's 8K): a 400 whose message
    starts with what makes Claude Code compact, streamed or not."""
    recorded = json.loads((CLIENTS / "claude-code-messages-thinking-block-in-history.json").read_text())
    for stream in (False, True):
        body = {**recorded["body"], "model": model, "stream": stream}
        response = httpx.post(f"{service.base_url}/v1/messages", json=body, timeout=600)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["message"].startswith("prompt is too long"), error


def shortened(value: Any, length: int = 120) -> Any:
    """The body with the capture's placeholder fillers cut to `length` characters: the
    shapes stay as sent, the prompt fits SmolLM2's window and prefills in seconds."""
    if isinstance(value, str):
        return value[:length] if value.startswith("[placeholder:") else value
    if isinstance(value, list):
        return [shortened(item, length) for item in value]
    if isinstance(value, dict):
        return {key: shortened(item, length) for key, item in value.items()}
    return value


def replay(service: Service, capture: str, model: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A captured body sent as the client sent it (path, headers, stream flag); the model
    name kept when aliases map it, else the served model's. -> (events, content)."""
    recorded = json.loads((CLIENTS / f"{capture}.json").read_text())
    body = shortened(recorded["body"])
    if not HAS_MODEL_ALIASES:
        body["model"] = model
    headers = {k: v for k, v in recorded["headers"].items()
               if k.lower() not in ("content-length", "host", "accept-encoding")}
    assert body.get("stream") is True
    events = stream_raw(service, body, recorded["path"], headers)
    return events, check_sequence(events)


@pytest.mark.parametrize("capture", [
    "claude-code-messages-session-title-structured-output",
    "claude-code-messages-topic-prefill-2.1.12",
    "claude-code-messages-thinking-block-in-history",
    "anthropic-python-messages-stream-tools-thinking",
])
def test_captured_bodies_are_answered(service: Service, capture: str, model: str) -> None:
    events, content = replay(service, capture, model)
    for block in content:
        assert block["type"] in ("text", "tool_use")
        assert block["type"] == "text" or isinstance(block["input"], dict)
    assert events[0]["message"]["model"] == (json.loads((CLIENTS / f"{capture}.json").read_text())["body"]["model"]
                                             if HAS_MODEL_ALIASES else model)


def test_the_tool_result_turn_reads_the_main_turns_prefix_from_the_cache(service: Service, model: str) -> None:
    """Claude Code's turn 2 resends turn 1 (its in-messages system entry now a string, not
    blocks) and appends the call and its result: all of turn 1's prompt but its last,
    partial block comes from the cache. The long prefill also shows its pings."""
    main_events, _ = replay(service, "claude-code-messages-main-turn-default-model", model)
    main = next(e for e in main_events if e["type"] == "message_delta")["usage"]
    # the capture has cache_control breakpoints: its prompt is all three figures
    main_prompt = main["input_tokens"] + main["cache_creation_input_tokens"] + main["cache_read_input_tokens"]
    assert main_prompt > 1000
    events, _ = replay(service, "claude-code-messages-tool-result-roundtrip", model)
    usage = next(e for e in events if e["type"] == "message_delta")["usage"]
    shared_blocks = (main_prompt - 8) // 256  # the turn's prompt but its generation prompt
    assert usage["cache_read_input_tokens"] >= shared_blocks * 256, (main, usage)
    assert any(e["type"] == "ping" for e in main_events), "a prefill of seconds sends pings"
    after_pings = [main_events[i + 1]["type"] for i, e in enumerate(main_events) if e["type"] == "ping"]
    assert set(after_pings) <= {"content_block_start", "content_block_delta"}, after_pings  # Claude Code skips pings


def test_a_resend_after_a_hangup_resumes_from_the_abandoned_prefill(service: Service, model: str) -> None:
    """Claude Code's timeout path: the client gives up mid-prefill and sends the identical
    body again. The abandoned request is aborted at the worker (it does not hold the model
    while the copy waits), and the copy reads the blocks it had completed from the cache
    instead of computing them again.

    The client hangs up once the cache probe sees the prompt's first blocks stored, not
    after a fixed time: on any machine that is mid-prefill, so the test cannot skip."""
    log = " ".join(f"entry {i}: request {i * 7} served in {i % 13} ms from worker {i % 3}." for i in range(330))
    body = {"model": model, "max_tokens": 8, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": "Which worker served request 700?\n" + log}]}
    with httpx.stream("POST", f"{service.base_url}/v1/messages", json=body, timeout=600) as response:
        assert response.status_code == 200
        events = sse_events_until(response, lambda e: e["type"] == "message_start")
        start = next(events)["message"]  # `events` stays referenced: closing it would hang up now
        deadline = time.monotonic() + 300
        while (seen := probe_cache(service, body))["hot_tokens"] < BLOCK_TOKENS:
            assert time.monotonic() < deadline, f"no block of the prompt was cached within 300 s: {seen}"
            time.sleep(0.1)
    # leaving the block hung up
    prompt_tokens = start["usage"]["input_tokens"] + start["usage"]["cache_read_input_tokens"]
    assert prompt_tokens > 6000 and seen["prompt_tokens"] == prompt_tokens
    assert seen["hot_tokens"] <= prompt_tokens - 2 * BLOCK_TOKENS, f"hung up after the prefill, not during it: {seen}"
    again = stream_raw(service, body)
    usage = next(e for e in again if e["type"] == "message_delta")["usage"]
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == prompt_tokens
    assert seen["hot_tokens"] <= usage["cache_read_input_tokens"] < prompt_tokens, (seen, usage)
    service.wait_for_log(f"request {start['id']} aborted after 0 tokens")


def probe_cache(service: Service, body: dict[str, Any]) -> dict[str, Any]:
    """Where `body`'s prompt is cached now (`POST /admin/cache/probe`): it only looks."""
    response = httpx.post(f"{service.base_url}/admin/cache/probe", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def sse_events_until(response: httpx.Response, wanted: Any) -> Iterator[dict[str, Any]]:
    """The stream's events that `wanted` picks, as they arrive (the caller may stop early)."""
    for line in response.iter_lines():
        if line.startswith("data: "):
            event = json.loads(line[len("data: "):])
            if wanted(event):
                yield event
