"""Tool calls on Qwen2.5-Coder-0.5B-Instruct, whose own template renders tools (the Hermes
dialect): the model decides to call (`tool_choice: "auto"`), and a full round trip. Few
and short: it decodes several times slower than SmolLM2 on a CPU."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import jsonschema
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
MODEL = "qwen2.5-coder-0.5b"
# the issue's own case: the 0.5B fills an enum ["c", "f"] with "fahrenheit" when it is free
UNIT_PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"},
                                                   "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}
ASK_UNIT = "What's the temperature in Tokyo in fahrenheit?"
UNIT_DESCRIPTION = "Get the current weather in a city, in celsius or fahrenheit."


@pytest.fixture(scope="module")
def qwen(qwen_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[openai.OpenAI, Service]]:
    home = tmp_path_factory.mktemp("home")
    (home / "config.toml").write_text(f'[profiles."{MODEL}:free"]\ntool_call_grammar = false\n'
                                      f'[profiles."{MODEL}:plain"]\nspeculation = "off"\n')
    with running_service(["--model", str(qwen_model_dir)], home) as svc:
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


def _valid(arguments: dict) -> bool:
    try:
        jsonschema.validate(arguments, UNIT_PARAMETERS)
    except jsonschema.ValidationError:
        return False
    return True


def test_a_call_is_held_to_its_enum_in_every_api_and_free_it_breaks(qwen: tuple[openai.OpenAI, Service]) -> None:
    """Chat (whole, streamed, and again from the cached prefix), Anthropic Messages and
    Responses all return a call whose `unit` is one the tool allows; the same request on
    the profile without the grammar returns the model's own broken value (the control)."""
    client, service = qwen
    tool = {"type": "function", "function": {"name": "get_weather", "description": UNIT_DESCRIPTION,
                                             "parameters": UNIT_PARAMETERS}}
    body = dict(messages=[{"role": "user", "content": ASK_UNIT}], tools=[tool], temperature=0, max_tokens=60)
    free = client.chat.completions.create(model=f"{MODEL}:free", **body).choices[0].message
    free_arguments = [json.loads(c.function.arguments) for c in free.tool_calls or []]
    # the model alone breaks it ("unit": "fahrenheit"), so its call stays text or is invalid
    assert not (free_arguments and all(_valid(a) for a in free_arguments)), free
    assert '"fahrenheit"' in (free.content or "") + json.dumps(free_arguments)

    held = [client.chat.completions.create(model=MODEL, **body) for _ in range(2)]
    assert held[1].usage.prompt_tokens_details.cached_tokens > 0  # the second from the prefix cache
    calls = [[(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls] for r in held]
    assert calls[0] == calls[1] and calls[0] and all(_valid(json.loads(a)) for _, a in calls[0]), calls
    streamed = ""
    for chunk in client.chat.completions.create(model=MODEL, stream=True, **body):
        for choice in chunk.choices:
            streamed += "".join(d.function.arguments or "" for d in choice.delta.tool_calls or [])
    assert streamed == "".join(a for _, a in calls[0])

    messages = anthropic.Anthropic(base_url=service.base_url, api_key="unused", max_retries=0, timeout=600)
    message = messages.messages.create(model=MODEL, max_tokens=60, messages=[{"role": "user", "content": ASK_UNIT}],
                                       tools=[{"name": "get_weather", "description": UNIT_DESCRIPTION,
                                               "input_schema": UNIT_PARAMETERS}],
                                       extra_body={"temperature": 0})  # this SDK has no sampling parameters
    uses = [block.input for block in message.content if block.type == "tool_use"]
    assert uses and all(_valid(u) for u in uses), message.content

    response = client.responses.create(model=MODEL, input=ASK_UNIT, temperature=0, max_output_tokens=60, store=False,
                                       tools=[{"type": "function", "name": "get_weather",
                                               "description": UNIT_DESCRIPTION,
                                               "parameters": UNIT_PARAMETERS}])
    items = [json.loads(item.arguments) for item in response.output if item.type == "function_call"]
    assert items and all(_valid(i) for i in items), response.output


RUN_TESTS = {"type": "function", "function": {
    "name": "run_tests", "description": "Run the project's test suite once an edit is done.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
EDIT = """Rename `total` to `amount` in this function and return the whole function:

```python
def add_all(values):
    total = 0
    for value in values:
        if value is not None:
            total += value
    return total
```"""


@pytest.mark.parametrize(("ask", "tool"), [(EDIT, RUN_TESTS), ("What is the weather in Paris?", WEATHER)],
                         ids=["edit", "call"])
def test_an_agent_turn_with_tools_speculates_and_answers_as_plain(qwen: tuple[openai.OpenAI, Service], ask: str,
                                                                  tool: dict) -> None:
    """With tools in `auto` the lazy call grammar holds the row: it drafts only while no
    draft could need a mask (before a trigger, outside the budget's zone), and the answer
    is the plain one, token for token, calls included."""
    client, _ = qwen

    def answer(model: str):
        system = "You are a coding assistant. Answer in text; call a tool only when the user asks for it."
        return client.chat.completions.create(model=model, messages=[{"role": "system", "content": system},
                                                                     {"role": "user", "content": ask}],
                                              tools=[tool], tool_choice="auto", temperature=0, max_tokens=80)

    plain, fast = answer(f"{MODEL}:plain"), answer(MODEL)
    assert fast.choices[0].message.content == plain.choices[0].message.content
    calls = [(c.function.name, c.function.arguments) for c in plain.choices[0].message.tool_calls or []]
    assert [(c.function.name, c.function.arguments) for c in fast.choices[0].message.tool_calls or []] == calls
    assert plain.model_extra["mlxd"]["timings"]["draft_tokens"] == 0
    assert calls  # the 0.5B calls a tool it is offered, even for an edit (tests/worker/test_speculation_exact.py
    # drafts a copy under the same lazy grammar, in-process, where the prompt shows no tools)
