"""What Claude Code needs around the Messages API, on the real service with the default
model: its model names reach a local model, `count_tokens` is exact and never waits behind
generation, its start-up probe needs no key, its key header is accepted, `/v1/models`
answers in Anthropic's shape, and `?beta=true` does not change routing."""

from __future__ import annotations

import concurrent.futures
import copy
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

from tests.integration.service import Service, running_service

pytestmark = pytest.mark.timeout(900)

CLIENTS = Path(__file__).resolve().parents[1] / "clients"  # request bodies captured from the real clients
KEY = "glue-test-key"
ANTHROPIC = {"x-api-key": KEY, "anthropic-version": "2023-06-01",
             "anthropic-beta": "claude-code-20250219,token-counting-2024-11-01,some-beta-from-the-future-2031-01-01"}
SYSTEM = "You are a terse assistant."
QUESTION = "What is the capital of France?"
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
BURST = 26  # what Claude Code's /context sends at once


@pytest.fixture(scope="module")
def service(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """One sequence at a time, so a running generation holds the only slot: anything that
    queued behind it would wait for it to end."""
    with running_service(["--model", str(default_model_dir), "--api-key", KEY, "--max-num-seqs", "1"],
                         tmp_path_factory.mktemp("home")) as svc:
        yield svc


@pytest.fixture(scope="module")
def http(service: Service) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service.base_url, timeout=600) as client:
        yield client


@pytest.fixture(scope="module")
def model_id(http: httpx.Client) -> str:
    return http.get("/v1/models", headers={"authorization": f"Bearer {KEY}"}).json()["data"][0]["id"]


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(default_model_dir))


def count(http: httpx.Client, body: dict[str, Any], path: str = "/v1/messages/count_tokens?beta=true") -> int:
    answer = http.post(path, json=body, headers=ANTHROPIC)
    assert answer.status_code == 200, answer.text
    assert set(answer.json()) == {"input_tokens"}
    return answer.json()["input_tokens"]


def chat_prompt_tokens(http: httpx.Client, model: str, messages: list[dict[str, Any]],
                       tools: list[dict[str, Any]] | None = None) -> int:
    """usage.prompt_tokens of the same conversation through the OpenAI route: the worker's
    own rendering of the prompt it generates from."""
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": 1, "temperature": 0}
    if tools:
        body["tools"] = tools
    answer = http.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {KEY}"})
    assert answer.status_code == 200, answer.text
    return answer.json()["usage"]["prompt_tokens"]


def captured(name: str) -> dict[str, Any]:
    return json.loads((CLIENTS / name).read_text())


# ---------------------------------------------------------------- model names


@pytest.mark.parametrize("name", ["claude-opus-5-5", "claude-haiku-4-5-20251001"])
def test_claude_model_names_reach_the_default_model(http: httpx.Client, service: Service, name: str) -> None:
    body = {"model": name, "messages": [{"role": "user", "content": QUESTION}]}
    assert count(http, body) > 0
    card = http.get(f"/v1/models/{name}", headers=ANTHROPIC)
    assert card.status_code == 200 and card.json()["id"] == name
    assert f"model '{name}' is served by" in service.log_text()


def test_a_name_no_pattern_matches_is_still_a_404(http: httpx.Client) -> None:
    answer = http.post("/v1/messages/count_tokens", headers=ANTHROPIC,
                       json={"model": "qwen3-coder-30b-nowhere", "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 404
    assert answer.json()["type"] == "error" and answer.json()["error"]["type"] == "not_found_error"
    chat = http.post("/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"},
                     json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 404 and chat.json()["error"]["code"] == "model_not_found"


# ---------------------------------------------------------------- count_tokens


def test_count_equals_the_rendered_prompt(http: httpx.Client, model_id: str, tokenizer: Any) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    expected = len(tokenizer.encode(rendered, add_special_tokens=False))
    body = {"model": model_id, "system": SYSTEM, "messages": [{"role": "user", "content": QUESTION}]}
    assert count(http, body) == expected
    assert chat_prompt_tokens(http, model_id, messages) == expected
    # blocks or a string, with or without cache_control: the same prompt
    blocks = {"model": model_id, "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
              "messages": [{"role": "user", "content": [{"type": "text", "text": QUESTION}]}], "tools": []}
    assert count(http, blocks) == expected


def test_count_with_tools_equals_what_generation_renders(http: httpx.Client, model_id: str) -> None:
    tool = {"name": "get_weather", "description": "Weather in a city.", "input_schema": WEATHER_SCHEMA}
    body = {"model": model_id, "system": SYSTEM, "messages": [{"role": "user", "content": QUESTION}],
            "tools": [tool]}
    openai_tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                                    "parameters": WEATHER_SCHEMA}}
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    with_tools = count(http, body)
    assert with_tools == chat_prompt_tokens(http, model_id, messages, [openai_tool])
    assert with_tools > count(http, {**body, "tools": []})


def test_a_prompt_too_long_for_the_window_is_counted_not_refused(http: httpx.Client, model_id: str) -> None:
    long_text = "the quick brown fox jumps over the lazy dog " * 1200  # ~10k tokens, SmolLM2's window is 8192
    body = {"model": model_id, "messages": [{"role": "user", "content": long_text}]}
    assert count(http, body) > 8192
    # generating from it is the 400 that carries both numbers
    answer = http.post("/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"},
                       json={"model": model_id, "messages": body["messages"], "max_tokens": 4})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "context_length_exceeded"


def test_messages_route_says_prompt_is_too_long(http: httpx.Client, model_id: str) -> None:
    long_text = "the quick brown fox jumps over the lazy dog " * 1200
    answer = http.post("/v1/messages", headers=ANTHROPIC, json={
        "model": "claude-opus-5-5", "max_tokens": 32000, "messages": [{"role": "user", "content": long_text}]})
    if answer.status_code == 404 and "no route" in answer.text:
        pytest.skip("POST /v1/messages is not wired in this build")
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"].startswith("prompt is too long")


def test_captured_count_tokens_body_is_answered(http: httpx.Client, model_id: str) -> None:
    """Replayed as Claude Code sent it: path with `?beta=true`, its headers, `tools` and no
    max_tokens; only the key (redacted in the capture) and the model (a local name its user
    had configured, served here under the default model's name) are this service's."""
    capture = captured("claude-code-count-tokens-context-burst.json")
    headers = {k: v for k, v in capture["headers"].items() if k.lower() not in ("connection", "accept-encoding")}
    headers["x-api-key"] = KEY
    body = {**capture["body"], "model": model_id}
    answer = http.request(capture["method"], capture["path"], json=body, headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.json()["input_tokens"] > 1000


def test_a_burst_of_counts_does_not_wait_for_a_running_generation(
        http: httpx.Client, service: Service, model_id: str, tokenizer: Any) -> None:
    """26 counts while a long generation holds the only slot: all answered while it runs,
    whereas a chat request sent before them waits for the slot until the generation ends
    (here: is cut off by its client leaving)."""
    no_end = {str(tokenizer.convert_tokens_to_ids(t)): -100 for t in ("<|im_end|>", "<|endoftext|>")}
    first_token, leave = threading.Event(), threading.Event()
    generation: list[int] = []  # tokens seen

    def generate() -> None:
        body = {"model": model_id, "stream": True, "max_tokens": 4000, "logit_bias": no_end,
                "messages": [{"role": "user", "content": "Count from 1 to 5000, one number per line."}]}
        with httpx.stream("POST", f"{service.base_url}/v1/chat/completions", json=body, timeout=600,
                          headers={"authorization": f"Bearer {KEY}"}) as stream:
            for line in stream.iter_lines():
                if line.startswith("data: {") and '"content"' in line:
                    generation.append(1)
                    first_token.set()
                if leave.is_set():
                    return  # closing the stream aborts the request, freeing the slot
        generation.append(-1)  # ran to its end: the test would prove nothing

    def queued_chat() -> int:
        return httpx.post(f"{service.base_url}/v1/chat/completions", timeout=600,
                          headers={"authorization": f"Bearer {KEY}"},
                          json={"model": model_id, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
                          ).status_code

    generator = threading.Thread(target=generate, daemon=True)
    generator.start()
    assert first_token.wait(120), "the long generation never started"
    body = copy.deepcopy(captured("claude-code-count-tokens-context-burst.json")["body"])
    body["model"] = "claude-opus-5-5"

    def one(_: int) -> tuple[int, int]:
        answer = httpx.post(f"{service.base_url}/v1/messages/count_tokens?beta=true", json=body,
                            headers=ANTHROPIC, timeout=600)
        return answer.status_code, answer.json().get("input_tokens", -1)

    with concurrent.futures.ThreadPoolExecutor(BURST + 1) as pool:
        waiting = pool.submit(queued_chat)
        time.sleep(0.5)  # it reaches the worker first, and queues for the slot
        answers = list(pool.map(one, range(BURST)))
        assert all(status == 200 for status, _ in answers), answers
        assert len({tokens for _, tokens in answers}) == 1  # the same body, the same count
        assert -1 not in generation, "the generation ended before the counts did; make it longer"
        assert not waiting.done(), "the chat request did not wait for the slot: the test proves nothing"
        leave.set()
        assert waiting.result(timeout=300) == 200
    generator.join(60)


# ---------------------------------------------------------------- probe, keys, models


@pytest.mark.parametrize("method", ["HEAD", "GET"])
def test_hello_probe_needs_no_key(http: httpx.Client, method: str) -> None:
    answer = http.request(method, "/api/hello", headers={"user-agent": "Bun/1.4.6"})
    assert answer.status_code == 200


def test_anthropic_keys_bearer_and_wrong(http: httpx.Client, model_id: str) -> None:
    body = {"model": model_id, "messages": [{"role": "user", "content": "hi"}]}
    bearer = {k: v for k, v in ANTHROPIC.items() if k != "x-api-key"} | {"authorization": f"Bearer {KEY}"}
    assert http.post("/v1/messages/count_tokens", json=body, headers=bearer).status_code == 200
    assert http.post("/v1/messages/count_tokens", json=body, headers=ANTHROPIC).status_code == 200
    wrong = http.post("/v1/messages/count_tokens?beta=true", json=body, headers={**ANTHROPIC, "x-api-key": "nope"})
    assert wrong.status_code == 401
    assert wrong.json()["type"] == "error" and wrong.json()["error"]["type"] == "authentication_error"
    missing = http.post("/v1/messages/count_tokens", json=body, headers={"anthropic-version": "2023-06-01"})
    assert missing.status_code == 401 and "x-api-key" in missing.json()["error"]["message"]
    # OpenAI routes keep OpenAI's shape
    openai_wrong = http.get("/v1/models", headers={"authorization": "Bearer nope"})
    assert openai_wrong.status_code == 401 and openai_wrong.json()["error"]["code"] == "invalid_api_key"


def test_models_in_anthropic_shape(http: httpx.Client, model_id: str) -> None:
    answer = http.get("/v1/models?beta=true", headers=ANTHROPIC).json()
    assert answer["has_more"] is False
    assert answer["first_id"] == answer["data"][0]["id"] and answer["last_id"] == answer["data"][-1]["id"]
    card = next(m for m in answer["data"] if m["id"] == model_id)
    assert set(card) == {"type", "id", "display_name", "created_at"} and card["type"] == "model"
    assert card["created_at"].endswith("Z") and "T" in card["created_at"]
    openai_shape = http.get("/v1/models", headers={"authorization": f"Bearer {KEY}"}).json()
    assert openai_shape["object"] == "list"
    missing = http.get("/v1/models/gpt-4o", headers=ANTHROPIC)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
