"""The turn after a tool call gets its whole previous prompt and the generated call from the
prefix cache (router.call_memory, worker.generated_turns), through the real service on
Qwen2.5-Coder-0.5B with the real SDKs. Greedy, the model writes this call as a bare JSON
object, which its template would render inside <tool_call> tags: without the memory the
second turn misses from the call on."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.integration.service import Service, running_service

pytestmark = pytest.mark.timeout(1200)

MODEL = "qwen2.5-coder-0.5b"
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"}},
              "required": ["city"]}
DESCRIPTION = "Get the current weather in a city."
ASK = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def service(qwen_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    # Qwen2.5-Coder-0.5B writes its calls as bare JSON objects, which the default
    # (`generated_calls = "markup"`) renders back in the template's markup: `always` is the
    # setting whose tokens these tests follow into the next turn
    with running_service(["--model", str(qwen_model_dir), "--generated-calls", "always"],
                         tmp_path_factory.mktemp("home"), ready_timeout=300) as svc:
        yield svc


def test_openai_turn_two_reads_turn_one_and_its_call_from_cache(service: Service) -> None:
    client = openai.OpenAI(base_url=f"{service.base_url}/v1", api_key="unused", max_retries=0, timeout=900)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": DESCRIPTION,
                                               "parameters": PARAMETERS}}]
    messages: list = [{"role": "user", "content": ASK}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=tools, temperature=0, max_tokens=60)
    assert first.choices[0].finish_reason == "tool_calls", first
    (call,) = first.choices[0].message.tool_calls
    # the client sends the call back re-serialized (other spacing), as clients do
    arguments = json.dumps(json.loads(call.function.arguments), separators=(",", ":"))
    messages += [{"role": "assistant", "content": None,
                  "tool_calls": [{"id": call.id, "type": "function",
                                  "function": {"name": call.function.name, "arguments": arguments}}]},
                 {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}]
    used = first.usage
    # the cache probe renders the body as a generation would, memory included
    probed = httpx.post(f"{service.base_url}/admin/cache/probe", timeout=300,
                        json={"model": MODEL, "messages": messages, "tools": tools}).json()
    assert probed["cached_tokens"] >= used.prompt_tokens + used.completion_tokens - 1, probed
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=tools, temperature=0, max_tokens=1)
    # all of turn one but its last generated token (the end of turn, never fed to the model)
    assert second.usage.prompt_tokens_details.cached_tokens >= used.prompt_tokens + used.completion_tokens - 1, \
        (used, second.usage)


def test_anthropic_turn_two_reads_turn_one_and_its_tool_use_from_cache(service: Service) -> None:
    client = anthropic.Anthropic(base_url=service.base_url, api_key="unused", max_retries=0, timeout=900)
    tools = [{"name": "get_weather", "description": DESCRIPTION, "input_schema": PARAMETERS}]
    messages: list = [{"role": "user", "content": f"{ASK} "}]  # not the OpenAI test's prompt: no shared cache
    first = client.messages.create(model=MODEL, max_tokens=60, tools=tools, messages=messages,
                                   extra_body={"temperature": 0})
    assert first.stop_reason == "tool_use", first
    (call,) = [block for block in first.content if block.type == "tool_use"]
    messages += [{"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18 C, sunny"}]}]
    second = client.messages.create(model=MODEL, max_tokens=1, tools=tools, messages=messages,
                                    extra_body={"temperature": 0})
    turn_one = first.usage.input_tokens + first.usage.cache_read_input_tokens + first.usage.output_tokens
    assert second.usage.cache_read_input_tokens >= turn_one - 1, (first.usage, second.usage)
