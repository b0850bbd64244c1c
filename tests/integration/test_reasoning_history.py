"""A turn after a reasoning turn hits the cache through that turn's generated tokens, on
the real service: a tiny random model with a reasoning template that keeps the reasoning
of the current tool loop (Qwen3's shape: the span opened by the generation prompt, shown
again for assistant turns after the last user message) thinks a few tokens under a
budget, then calls a tool (pulled there by `logit_bias`). The next turn sends that
reasoning back in each API's own field (chat `reasoning_content`, Anthropic `thinking`
blocks as Claude Code does, a Responses `reasoning` item) and its prompt is cached past
turn one's prompt, into the generated answer; the same turn with the reasoning left out
renders without it and misses from that answer on (the control)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from tests.added_tokens import SMOLLM2_VOCAB as VOCAB
from tests.added_tokens import add_tokens
from tests.integration.service import Service, running_service
from tests.integration.test_pool import make_tiny_dir
from tests.worker import chat_templates

pytestmark = pytest.mark.timeout(600)

MODEL = "tiny-thinker"
PROFILE = f"{MODEL}:think"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
           "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                           "parameters": WEATHER}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
RESULT = "Sunny, 21 degrees."


@pytest.fixture(scope="module")
def service(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    models = tmp_path_factory.mktemp("models")
    target = make_tiny_dir(models / MODEL, default_model_dir, vocab_size=VOCAB + 8)
    config = json.loads((target / "tokenizer_config.json").read_text())
    config["chat_template"] = chat_templates.thinking(opens_in_prompt=True)
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    add_tokens(target, ["<tool_call>", "</tool_call>"], special=False)
    home = tmp_path_factory.mktemp("home")
    (home / "config.toml").write_text(f'[profiles."{PROFILE}"]\nreasoning_budget = 3\n')
    with running_service(["--model-dir", str(models), "--model", MODEL, "--no-cold-tier"], home) as svc:
        yield svc


@pytest.fixture(scope="module")
def client(service: Service) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{service.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def turn_one(client: openai.OpenAI) -> Any:
    """Three tokens of reasoning (the budget closes the span), then one call."""
    answer = client.chat.completions.create(model=PROFILE, messages=ASK, tools=TOOLS, max_tokens=60, temperature=0,
                                            parallel_tool_calls=False, logit_bias={str(VOCAB): 100})
    message = answer.choices[0].message
    assert answer.choices[0].finish_reason == "tool_calls", answer
    assert message.model_extra.get("reasoning_content") and len(message.tool_calls) == 1
    return answer


def chat_history(turn_one: Any, reasoning: bool = True) -> list[dict[str, Any]]:
    message = turn_one.choices[0].message
    (call,) = message.tool_calls
    said: dict[str, Any] = {"role": "assistant", "content": message.content or "",
                            "tool_calls": [call.model_dump(include={"id", "type", "function"})]}
    if reasoning:
        said["reasoning_content"] = message.model_extra["reasoning_content"]
    return [*ASK, said, {"role": "tool", "tool_call_id": call.id, "content": RESULT}]


def cached_after(client: openai.OpenAI, messages: list[dict[str, Any]]) -> int:
    answer = client.chat.completions.create(model=PROFILE, messages=messages, tools=TOOLS, max_tokens=4,
                                            temperature=0)
    return answer.usage.prompt_tokens_details.cached_tokens


def test_the_next_chat_turn_hits_through_the_reasoning_turn(client: openai.OpenAI, turn_one: Any) -> None:
    prompt = turn_one.usage.prompt_tokens
    assert cached_after(client, chat_history(turn_one)) > prompt + turn_one.usage.completion_tokens // 2
    # the control: without its reasoning the turn renders otherwise, and misses from there
    assert cached_after(client, chat_history(turn_one, reasoning=False)) <= prompt


def test_claude_codes_thinking_block_in_the_history_hits_the_same_way(service: Service, turn_one: Any) -> None:
    message = turn_one.choices[0].message
    (call,) = message.tool_calls
    assistant: list[dict[str, Any]] = [
        {"type": "thinking", "thinking": message.model_extra["reasoning_content"],
         "signature": "EqQBCkYIBxgCKkBLOCALSIGNATUREFAKEAAAA=="},  # another server's: accepted, unread
        {"type": "tool_use", "id": "toolu_" + call.id.removeprefix("call_"), "name": "get_weather",
         "input": json.loads(call.function.arguments)}]
    if message.content:
        assistant.insert(1, {"type": "text", "text": message.content})
    claude = anthropic.Anthropic(base_url=service.base_url, api_key="unused", max_retries=0, timeout=120)
    answer = claude.messages.create(
        model=PROFILE, max_tokens=4, extra_body={"temperature": 0},
        tools=[{"name": "get_weather", "description": "Weather in a city.", "input_schema": WEATHER}],
        messages=[{"role": "user", "content": ASK[0]["content"]}, {"role": "assistant", "content": assistant},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": assistant[-1]["id"],
                                                "content": RESULT}]}])
    prompt = turn_one.usage.prompt_tokens
    assert answer.usage.cache_read_input_tokens > prompt + turn_one.usage.completion_tokens // 2


def test_a_responses_reasoning_item_in_the_input_hits_the_same_way(client: openai.OpenAI, turn_one: Any) -> None:
    message = turn_one.choices[0].message
    (call,) = message.tool_calls
    items: list[dict[str, Any]] = [
        {"role": "user", "content": ASK[0]["content"]},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": message.model_extra["reasoning_content"]}]},
        {"type": "function_call", "call_id": call.id, "name": "get_weather", "arguments": call.function.arguments},
        {"type": "function_call_output", "call_id": call.id, "output": RESULT}]
    response = client.responses.create(model=PROFILE, input=items, max_output_tokens=4, temperature=0,
                                       tools=[{"type": "function", "name": "get_weather",
                                               "description": "Weather in a city.", "parameters": WEATHER}])
    prompt = turn_one.usage.prompt_tokens
    assert response.usage.input_tokens_details.cached_tokens > prompt + turn_one.usage.completion_tokens // 2
