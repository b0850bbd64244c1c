"""worker.tool_prompt and worker.prompts.render_chat: tools reach the prompt in the model's
dialect (its own template, or mlxd's fallback), a second turn sees its call and the result,
and the same request always renders the same tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import transformers

from protocol.errors import RequestError
from protocol.settings import TEMPLATE_LAYOUT
from protocol.tool_dialects import HERMES, LLAMA3_JSON, MISTRAL, MLXD
from tests.worker import chat_templates
from worker.prompts import render_chat
from worker.tool_prompt import detect_tool_dialect, fallback_messages, template_messages, template_source

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
TURN1 = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Weather in Paris?"}]
TURN2 = TURN1 + [{"role": "assistant", "content": "", "tool_calls": [CALL]},
                 {"role": "tool", "tool_call_id": "call_abc", "content": "18 C, sunny"}]


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path) -> Any:
    """SmolLM2's tokenizer: its template has no tools, so prompts use the fallback."""
    return transformers.AutoTokenizer.from_pretrained(default_model_dir)


@pytest.fixture
def qwen_templated(tokenizer: Any) -> Any:
    """The same vocabulary under Qwen2.5's template (the Hermes dialect)."""
    original = tokenizer.chat_template
    tokenizer.chat_template = chat_templates.QWEN25
    yield tokenizer
    tokenizer.chat_template = original


def text(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    return tokenizer.decode(render_chat(tokenizer, messages, tools))


@pytest.mark.parametrize("template, dialect", [
    (None, MLXD),
    (chat_templates.SMOLLM2, MLXD),
    (chat_templates.QWEN25, HERMES),
    (chat_templates.LLAMA31_TOOL_PART, LLAMA3_JSON),
    (chat_templates.MISTRAL_TOOL_PART, MISTRAL),
    ("{% for tool in tools %}<function={{ tool.function.name }}>{% endfor %}", MLXD),  # a format we cannot parse
])
def test_detect_tool_dialect(template: str | None, dialect: str) -> None:
    assert detect_tool_dialect(template) == dialect


def test_a_named_template_for_tools_is_the_one_detected() -> None:
    class Tokenizer:
        def __init__(self) -> None:
            self.chat_template = {"default": chat_templates.SMOLLM2, "tool_use": chat_templates.QWEN25}

    assert detect_tool_dialect(template_source(Tokenizer())) == HERMES


def test_fallback_puts_the_tools_in_the_system_prompt(tokenizer: Any) -> None:
    prompt = text(tokenizer, TURN1, [WEATHER])
    assert prompt.startswith("<|im_start|>system\n# Tools\n")  # stable first: the tools, then the system text
    assert "When no function is needed, answer normally.\n\nYou are terse.<|im_end|>\n" in prompt
    as_template = tokenizer.decode(render_chat(tokenizer, TURN1, [WEATHER], layout=TEMPLATE_LAYOUT))
    assert as_template.startswith("<|im_start|>system\nYou are terse.\n\n# Tools\n")
    assert json.dumps(WEATHER["function"]) in prompt
    assert '<tool_call>\n{"name": "<function name>", "arguments": {<the arguments as a JSON object>}}\n</tool_call>' \
        in prompt
    assert prompt.endswith("<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n")
    # no system message: one is made for the tools
    alone = text(tokenizer, TURN1[1:], [WEATHER])
    assert alone.startswith("<|im_start|>system\n# Tools\n")


def test_fallback_renders_calls_and_results_as_text(tokenizer: Any) -> None:
    second = TURN2 + [{"role": "tool", "tool_call_id": "call_x", "content": "second result"}]
    prompt = text(tokenizer, second, [WEATHER])
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call><|im_end|>\n') in prompt
    assert ("<|im_start|>user\n<tool_response>\n18 C, sunny\n</tool_response>\n"
            "<tool_response>\nsecond result\n</tool_response><|im_end|>\n<|im_start|>assistant\n") in prompt
    with_text = [*TURN1, {"role": "assistant", "content": "Checking.", "tool_calls": [CALL]}]
    assert "<|im_start|>assistant\nChecking.\n<tool_call>\n" in text(tokenizer, with_text, [WEATHER])


def test_without_tools_the_history_still_renders(tokenizer: Any) -> None:
    """tool_choice "none" sends no tools, but the history may hold calls and results."""
    prompt = text(tokenizer, TURN2, None)
    assert "# Tools" not in prompt and "<tool_call>" in prompt and "<tool_response>" in prompt


@pytest.mark.parametrize("templated", [False, True], ids=["fallback", "qwen"])
def test_rendering_is_deterministic_and_turn_two_extends_turn_one(tokenizer: Any, qwen_templated: Any,
                                                                  templated: bool) -> None:
    """The prefix cache's premise: the same body gives the same tokens, and the next turn
    starts with the tokens of this one's prompt (so only the new part is computed)."""
    if not templated:
        qwen_templated.chat_template = chat_templates.SMOLLM2
    one = render_chat(qwen_templated, TURN1, [WEATHER])
    assert render_chat(qwen_templated, [dict(m) for m in TURN1], [dict(WEATHER)]) == one
    two = render_chat(qwen_templated, TURN2, [WEATHER])
    assert two[: len(one)] == one
    spaced = [*TURN1, {**TURN2[2], "tool_calls": [{**CALL, "function": {**CALL["function"],
                                                                          "arguments": '{"city": "Paris"}'}}]},
              TURN2[3]]
    assert render_chat(qwen_templated, spaced, [WEATHER]) == two  # arguments are re-serialized one way


def test_a_tool_template_gets_tools_and_calls_as_it_expects(qwen_templated: Any) -> None:
    prompt = text(qwen_templated, TURN2, [WEATHER])
    assert "<tools>\n" + json.dumps(WEATHER) + "\n</tools>" in prompt
    # arguments as an object, not OpenAI's JSON string quoted a second time
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n18 C, sunny\n</tool_response><|im_end|>\n"
            ) in prompt
    assert "You can call functions to help answer the user" not in prompt  # not mlxd's fallback block


def test_mistral_ids_are_mapped_to_nine_alphanumerics_the_same_way_twice() -> None:
    messages = [{"role": "assistant", "content": "", "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_abc", "content": "ok"}]
    out = template_messages(messages, MISTRAL)
    call_id = out[0]["tool_calls"][0]["id"]
    assert len(call_id) == 9 and call_id.isalnum() and out[1]["tool_call_id"] == call_id
    assert template_messages(messages, MISTRAL) == out
    assert out[0]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert template_messages(messages, HERMES)[0]["tool_calls"][0]["id"] == "call_abc"


def test_fallback_keeps_arguments_that_are_not_json_as_they_are() -> None:
    broken = {**CALL, "function": {"name": "get_weather", "arguments": "{city: Paris"}}
    out = fallback_messages([{"role": "assistant", "content": "", "tool_calls": [broken]}], None)
    assert out[0]["content"] == '<tool_call>\n{"name": "get_weather", "arguments": "{city: Paris"}\n</tool_call>'


LATE_SYSTEM = [*TURN1, {"role": "system", "content": "Note: the user prefers Celsius."}]
STRICT = ("{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
          "{{ raise_exception('system messages are only allowed first') }}{% endif %}"
          "<|{{ m.role }}|>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
DROPPING = ("{% for m in messages %}{% if loop.first or m.role != 'system' %}<|{{ m.role }}|>{{ m.content }}"
            "{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")


def test_a_late_system_message_renders_in_place_where_the_template_allows(qwen_templated: Any) -> None:
    """Claude Code's system notes inside `messages`: in place, the prompt before them is
    the same as without them (so a note added late keeps the cached prefix)."""
    prompt = text(qwen_templated, LATE_SYSTEM, None)
    assert prompt.endswith("<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>system\n"
                           "Note: the user prefers Celsius.<|im_end|>\n<|im_start|>assistant\n")
    without = render_chat(qwen_templated, TURN1, None, continue_final=False)
    with_note = render_chat(qwen_templated, LATE_SYSTEM, None)
    assert with_note[: len(without) - 3] == without[:-3]  # all but the generation prompt


@pytest.mark.parametrize("template", [STRICT, DROPPING], ids=["raises", "drops"])
def test_a_template_that_takes_system_only_first_gets_it_hoisted(tokenizer: Any, template: str) -> None:
    original = tokenizer.chat_template
    tokenizer.chat_template = template
    try:
        prompt = text(tokenizer, LATE_SYSTEM, None)
        assert prompt == ("<|system|>You are terse.\n\nNote: the user prefers Celsius.<|user|>Weather in Paris?"
                          "<|assistant|>")
    finally:
        tokenizer.chat_template = original


@pytest.mark.parametrize("messages", [TURN1, LATE_SYSTEM], ids=["plain", "late-system"])
def test_a_template_that_refuses_the_messages_is_a_400(tokenizer: Any, messages: list[dict[str, Any]]) -> None:
    original = tokenizer.chat_template
    tokenizer.chat_template = "{{ raise_exception('roles must alternate') }}"
    try:
        with pytest.raises(RequestError, match="rejected these messages: roles must alternate"):
            render_chat(tokenizer, messages, None)
    finally:
        tokenizer.chat_template = original
