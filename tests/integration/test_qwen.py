"""The agents' model, Qwen2.5-Coder-0.5B-Instruct (provisioned from its split wheels),
served for real. Few and short: it decodes about 4x slower than SmolLM2 on a CPU."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.integration.service import Service, running_service

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def qwen_service(qwen_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with running_service(["--model", str(qwen_model_dir)], tmp_path_factory.mktemp("home")) as svc:
        yield svc


def test_greedy_chat_answers_paris(qwen_service: Service) -> None:
    client = openai.OpenAI(base_url=f"{qwen_service.base_url}/v1", api_key="unused", max_retries=0,
                           timeout=300)
    response = client.chat.completions.create(
        model="qwen2.5-coder-0.5b",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
        max_tokens=30,
    )
    choice = response.choices[0]
    assert "Paris" in choice.message.content, choice.message.content
    assert choice.finish_reason == "stop"  # <|im_end|> ends the turn: the eos ids came through
    assert response.model == "qwen2.5-coder-0.5b"
