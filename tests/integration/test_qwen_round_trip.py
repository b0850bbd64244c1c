"""A full tool round trip on Qwen2.5-Coder-1.5B-Instruct (Hermes dialect, its own template):
the model calls the weather tool, the call and its result are rendered back through the
template, and the model answers in words from the result.

On the 1.5B, not the 0.5B: given the result, the 0.5B either calls get_weather again
(`tool_choice: "auto"`) or writes JSON (`"none"`), however the turn is phrased; the
rendering is the same for both sizes (tests/worker/test_tool_prompt.py checks it against
Qwen's template), so what fails there is the model, not mlxd."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.integration.service import running_service
from tests.integration.test_qwen_tool_calls import ASK, WEATHER

pytestmark = pytest.mark.timeout(1200)
MODEL = "qwen2.5-coder-1.5b"


@pytest.fixture(scope="module")
def qwen(qwen_1_5b_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    with running_service(["--model", str(qwen_1_5b_model_dir)],
                         tmp_path_factory.mktemp("home"), ready_timeout=600) as svc:
        yield openai.OpenAI(base_url=f"{svc.base_url}/v1", api_key="unused", max_retries=0, timeout=900)


def test_round_trip_call_result_then_an_answer_that_uses_it(qwen: openai.OpenAI) -> None:
    """The last turn offers no further call (`tool_choice: "none"`): with "auto" both
    Qwen2.5-Coder sizes call get_weather again instead of answering, whatever the phrasing;
    what this checks is that the model sees its call and the result."""
    client = qwen
    choice = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="auto",
                                            temperature=0, max_tokens=60).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (first_call,) = choice.message.tool_calls
    assert first_call.function.name == "get_weather"
    assert json.loads(first_call.function.arguments)["city"] == "Paris"
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [first_call.model_dump()]},
               {"role": "tool", "tool_call_id": first_call.id, "content": "18 degrees Celsius and sunny"}]
    reply = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER],
                                           tool_choice="none", temperature=0, max_tokens=60)
    choice = reply.choices[0]
    answer = choice.message.content
    assert choice.message.tool_calls is None and choice.finish_reason == "stop", choice
    assert "get_weather" not in answer and "{" not in answer, answer  # words, not the call (or JSON) again
    assert "18" in answer or "sunny" in answer.lower(), answer
