"""The output budget on the real service: a request without max_tokens gets the rest of
the window up to the server's cap, a huge max_tokens (OpenCode's 32000, Claude Code's
128000) is clamped with a log line instead of refused, and a profile's cap is tighter."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.integration.service import Service, running_service

CAP = 24
PROFILE_CAP = 8
LONG = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}]


@pytest.fixture(scope="module")
def service(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    home = tmp_path_factory.mktemp("home")
    (home / "config.toml").write_text(f'[profiles."{default_model_dir.name}:short"]\nmax_output_tokens = {PROFILE_CAP}\n')
    with running_service(["--model", str(default_model_dir), "--max-output-tokens", str(CAP)], home) as svc:
        yield svc


def test_caps(service: Service, default_model_dir: Path) -> None:
    client = openai.OpenAI(base_url=f"{service.base_url}/v1", api_key="none")
    model = default_model_dir.name

    def ask(name: str, **extra: object) -> openai.types.chat.ChatCompletion:
        return client.chat.completions.create(model=name, messages=LONG, temperature=0, **extra)

    free = ask(model)  # no limit: the window, up to the cap
    assert (free.usage.completion_tokens, free.choices[0].finish_reason) == (CAP, "length")
    huge = ask(model, max_tokens=32000)  # clamped, not a 400
    assert (huge.usage.completion_tokens, huge.choices[0].message.content) == (CAP, free.choices[0].message.content)
    assert "max_tokens 32000 clamped to this model's output cap" in service.log_text()
    short = ask(f"{model}:short", max_completion_tokens=128000)
    assert (short.usage.completion_tokens, short.choices[0].finish_reason) == (PROFILE_CAP, "length")
    assert ask(model, max_tokens=5).usage.completion_tokens == 5  # a smaller limit is the client's
