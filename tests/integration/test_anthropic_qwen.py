"""Tool use through the Anthropic SDK on the real Qwen2.5-Coder models (Hermes dialect, their
own templates): the 0.5B decides to call (`tool_choice: auto`), streamed and whole, and on
the 1.5B a full round trip, tool_use -> tool_result -> an answer in words from the result
(the 0.5B cannot do that last step, see tests/integration/test_qwen_round_trip.py).

Each service lives for one test only: the two models are not loaded at once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest

from tests.integration.service import Service

pytestmark = pytest.mark.timeout(1200)

WEATHER = {"name": "get_weather", "description": "Get the current weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"}},
                            "required": ["city"]}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"extra_body": {"temperature": 0}}  # this SDK has no sampling parameters; the API reads them


def _serve(model_dir: Path, home: Path, timeout: float) -> Iterator[anthropic.Anthropic]:
    svc = Service(["--model", str(model_dir)], home=home)
    try:
        svc.wait_ready(timeout=timeout)
        yield anthropic.Anthropic(base_url=svc.base_url, api_key="unused", max_retries=0, timeout=900)
    finally:
        svc.stop()


@pytest.fixture
def qwen_small(qwen_model_dir: Path, tmp_path: Path) -> Iterator[anthropic.Anthropic]:
    yield from _serve(qwen_model_dir, tmp_path / "home", 300)


@pytest.fixture
def qwen_large(qwen_1_5b_model_dir: Path, tmp_path: Path) -> Iterator[anthropic.Anthropic]:
    yield from _serve(qwen_1_5b_model_dir, tmp_path / "home", 600)


def test_auto_calls_the_tool_the_same_streamed_or_not(qwen_small: anthropic.Anthropic) -> None:
    request = dict(model="qwen2.5-coder-0.5b", max_tokens=60, tools=[WEATHER], tool_choice={"type": "auto"},
                   messages=ASK, **GREEDY)
    message = qwen_small.messages.create(**request)
    assert message.stop_reason == "tool_use", message
    (call,) = [block for block in message.content if block.type == "tool_use"]
    assert call.name == "get_weather" and call.input == {"city": "Paris"}
    assert all("<tool_call>" not in block.text for block in message.content if block.type == "text")
    with qwen_small.messages.stream(**request) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [(b.type, getattr(b, "input", None)) for b in final.content] == \
        [(b.type, getattr(b, "input", None)) for b in message.content]


def test_round_trip_tool_use_result_then_an_answer_that_uses_it(qwen_large: anthropic.Anthropic) -> None:
    """The last turn offers no further call (`tool_choice: none`), as in the OpenAI round
    trip: with auto, Qwen2.5-Coder calls get_weather again whatever the phrasing."""
    model = "qwen2.5-coder-1.5b"
    first = qwen_large.messages.create(model=model, max_tokens=60, tools=[WEATHER], tool_choice={"type": "auto"},
                                       messages=ASK, **GREEDY)
    assert first.stop_reason == "tool_use", first
    (call,) = [block for block in first.content if block.type == "tool_use"]
    assert call.input["city"] == "Paris"
    history = [*ASK, {"role": "assistant", "content": [block.model_dump() for block in first.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                             "content": [{"type": "text", "text": "18 degrees Celsius and sunny"}]}]}]
    reply = qwen_large.messages.create(model=model, max_tokens=60, tools=[WEATHER], tool_choice={"type": "none"},
                                       messages=history, **GREEDY)
    assert reply.stop_reason == "end_turn", reply
    (block,) = reply.content
    answer = block.text
    assert "get_weather" not in answer and "{" not in answer, answer
    assert "18" in answer or "sunny" in answer.lower(), answer
