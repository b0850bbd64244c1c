"""llama3_json and mistral tool calls end to end through their families' real chat templates
(tests/integration/chat_templates/), on tiny random-weight llamas whose tokenizer is SmolLM2's
with the template swapped in: the worker detects the dialect from the template as it would
for the real family, the prompt carries the tools in the family's layout (checked block by
block against the template rendered by HF transformers here), and an answer in the family's
call syntax comes back as OpenAI `tool_calls`. A random model writes no call by itself, so
the answer is forced by real mechanisms only: the grammar of a named or "required"
`tool_choice`, or a `response_format` JSON schema with `tool_choice` left "auto" (then the
call is found by the dialect's parser alone, as in a free answer)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.integration.service import Service, running_service
from tests.integration.test_pool import make_tiny_dir

pytestmark = pytest.mark.timeout(600)

TEMPLATES = Path(__file__).resolve().parent / "chat_templates"
BLOCK_TOKENS = 16  # small blocks: the probe's block keys then cover all but the prompt's last few tokens


@dataclass(frozen=True)
class Family:
    model: str  # the tiny model's id
    template: str  # the file in TEMPLATES
    arguments_key: str  # where the family's call syntax puts the arguments


FAMILIES = {
    "llama3_json": Family("tiny-llama-3.1", "llama-3.1-instruct.jinja", "parameters"),
    "mistral": Family("tiny-mistral-v0.3", "mistral-7b-instruct-v0.3.jinja", "arguments"),
}

# enums only: a random model fills free strings until its tokens run out
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Lyon", "Nice"]},
                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city.",
                                            "parameters": WEATHER_PARAMETERS}}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "Get the time in a city.",
                                          "parameters": {"type": "object", "properties": {
                                              "city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
                                              "required": ["city"], "additionalProperties": False}}}
SYSTEM = "You are a weather assistant."
USER = "What is the weather in Paris?"
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]


def family_layout(dialect: str) -> str:
    """The stretch of prompt text where the family's template puts the tools, as its model
    was trained to read them: Llama 3.1 in the first user turn (indented JSON after its
    instructions, then the user's text); Mistral v0.3 in [AVAILABLE_TOOLS] right before the
    last [INST], which holds the system text and the user's."""
    if dialect == "llama3_json":
        return ("<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a "
                "JSON for a function call with its proper arguments that best answers the given prompt.\n\n"
                'Respond in the format {"name": function name, "parameters": dictionary of argument name and its '
                'value}.Do not use variables.\n\n' + json.dumps(WEATHER, indent=4) + "\n\n" + USER + "<|eot_id|>")
    return ("[AVAILABLE_TOOLS] [" + json.dumps(WEATHER) + "][/AVAILABLE_TOOLS][INST] " + SYSTEM + "\n\n" + USER
            + "[/INST]")


@pytest.fixture(scope="module")
def models(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny llama per family, its tokenizer_config.json's chat template the family's."""
    models = tmp_path_factory.mktemp("models")
    first = make_tiny_dir(models / "tiny-llama-3.1", default_model_dir)
    for family in FAMILIES.values():
        target = models / family.model
        if target != first:
            shutil.copytree(first, target)
        config_path = target / "tokenizer_config.json"
        config = json.loads(config_path.read_text())
        config["chat_template"] = (TEMPLATES / family.template).read_text()
        config_path.write_text(json.dumps(config))
    return models


@pytest.fixture(scope="module")
def service(models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with running_service(["--model-dir", str(models), "--model", FAMILIES["llama3_json"].model, "--no-cold-tier",
                         "--block-tokens", str(BLOCK_TOKENS)], tmp_path_factory.mktemp("home")) as svc:
        yield svc


@pytest.fixture(scope="module")
def client(service: Service) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{service.base_url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module", params=list(FAMILIES))
def dialect(request: pytest.FixtureRequest, client: openai.OpenAI) -> str:
    """The family under test, its model loaded (the service starts with the first only)."""
    client.chat.completions.create(model=FAMILIES[request.param].model, messages=MESSAGES, max_tokens=1)
    return request.param


def probe(service: Service, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{service.base_url}/admin/cache/probe", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


def test_the_worker_detects_the_dialect_from_the_real_template(service: Service, dialect: str) -> None:
    assert service.health()["workers"][FAMILIES[dialect].model]["tool_dialect"] == dialect
    assert f"tool calls in the {dialect} dialect" in service.log_text()


def test_the_prompt_carries_the_tools_in_the_family_layout(service: Service, client: openai.OpenAI, models: Path,
                                                           dialect: str) -> None:
    """The template rendered here by HF transformers (what the family's own serving stacks
    do) has the tools in the family's layout; the worker's prompt for the same chat request
    is those very tokens: the same count and, block by block, the same keys as a probe of
    the reference's token ids sent as a completions prompt."""
    from transformers import AutoTokenizer

    model = FAMILIES[dialect].model
    tokenizer = AutoTokenizer.from_pretrained(models / model)
    text = tokenizer.apply_chat_template(MESSAGES, tools=[WEATHER], add_generation_prompt=True, tokenize=False)
    assert family_layout(dialect) in text
    reference = tokenizer.encode(text, add_special_tokens=False)
    served = probe(service, {"model": model, "messages": MESSAGES, "tools": [WEATHER]})
    as_ids = probe(service, {"model": model, "prompt": reference})
    assert served["prompt_tokens"] == as_ids["prompt_tokens"] == len(reference)
    keys = [block["key"] for block in served["blocks"]]
    assert len(keys) == len(reference) // BLOCK_TOKENS
    assert keys == [block["key"] for block in as_ids["blocks"]]
    # the whole blocks reach past the tools' definitions: they are inside what the keys compare
    definitions = json.dumps(WEATHER, indent=4 if dialect == "llama3_json" else None)
    through_tools = text[:text.index(definitions) + len(definitions)]
    assert len(tokenizer.encode(through_tools, add_special_tokens=False)) <= len(keys) * BLOCK_TOKENS
    # and a request says the same count; without tools the prompt has none of them
    answer = client.chat.completions.create(model=model, messages=MESSAGES, tools=[WEATHER], max_tokens=1)
    assert answer.usage.prompt_tokens == len(reference)
    without = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert family_layout(dialect) not in without
    plain = probe(service, {"model": model, "messages": MESSAGES})
    assert plain["prompt_tokens"] == len(tokenizer.encode(without, add_special_tokens=False)) < len(reference)


def raw_answer(choice: Any) -> str:
    """The answer's text as the model wrote it, token by token (the logprobs' tokens)."""
    return "".join(entry.token for entry in choice.logprobs.content)


def assert_the_call_is_parsed(dialect: str, choice: Any, names: set[str]) -> tuple[str, dict[str, Any]]:
    """The answer, written in the family's call syntax, came back as one OpenAI tool call
    with exactly its name and arguments, and finish_reason "tool_calls"."""
    raw = raw_answer(choice)
    value, end = json.JSONDecoder().raw_decode(raw)
    assert raw[end:].strip() == "", raw
    key = FAMILIES[dialect].arguments_key
    written = value[0] if dialect == "mistral" else value
    if dialect == "mistral":
        assert raw.startswith('[{"name": "') and len(value) == 1, raw
    else:
        assert raw.startswith('{"name": "'), raw
    assert list(written) == ["name", key], raw
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id
    assert call.function.name == written["name"] and call.function.name in names
    arguments = json.loads(call.function.arguments)
    assert arguments == written[key]
    return call.function.name, arguments


@pytest.mark.parametrize("tool_choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"])
def test_a_forced_call_in_the_family_syntax_comes_back_as_tool_calls(client: openai.OpenAI, dialect: str,
                                                                    tool_choice: Any) -> None:
    """The grammar of a forcing tool_choice makes the model write the call in its family's
    syntax (`{"name", "parameters"}` for Llama 3, `[{"name", "arguments"}]` for Mistral:
    the array its [TOOL_CALLS] token opens); the dialect's parser turns it into tool_calls,
    streamed or whole, the same."""
    kwargs = dict(model=FAMILIES[dialect].model, messages=MESSAGES, tools=[WEATHER, CLOCK], tool_choice=tool_choice,
                  temperature=0, max_tokens=200)
    choice = client.chat.completions.create(**kwargs, logprobs=True).choices[0]
    names = {"get_weather"} if isinstance(tool_choice, dict) else {"get_weather", "get_time"}
    name, arguments = assert_the_call_is_parsed(dialect, choice, names)
    if name == "get_weather":
        assert arguments["city"] in ("Paris", "Lyon", "Nice") and arguments["unit"] in ("celsius", "fahrenheit")
    streamed_name, streamed_arguments, finish = "", "", None
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        for delta_call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            assert delta_call.index == 0
            streamed_name += delta_call.function.name or ""
            streamed_arguments += delta_call.function.arguments or ""
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert (streamed_name, json.loads(streamed_arguments), finish) == (name, arguments, "tool_calls")


def test_a_call_in_the_family_syntax_is_found_with_tool_choice_auto(client: openai.OpenAI, dialect: str) -> None:
    """No tool grammar: a JSON schema (response_format) holds the answer to the family's
    call syntax, and the dialect's parser alone, as for a free answer, finds the call in
    it (Llama 3's bare JSON object; Mistral's bare array, as its answer reads once the
    detokenizer drops [TOOL_CALLS])."""
    key = FAMILIES[dialect].arguments_key
    call_schema = {"type": "object", "properties": {"name": {"const": "get_weather"}, key: WEATHER_PARAMETERS},
                   "required": ["name", key], "additionalProperties": False}
    schema = call_schema if dialect == "llama3_json" else {"type": "array", "items": call_schema,
                                                           "minItems": 1, "maxItems": 1}
    choice = client.chat.completions.create(
        model=FAMILIES[dialect].model, messages=MESSAGES, tools=[WEATHER, CLOCK], temperature=0, max_tokens=200,
        logprobs=True, response_format={"type": "json_schema", "json_schema": {"name": "call", "schema": schema}},
    ).choices[0]
    assert_the_call_is_parsed(dialect, choice, {"get_weather"})
