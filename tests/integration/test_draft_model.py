"""A draft model on the real service: Qwen2.5-Coder-1.5B served with the 0.5B drafting
(`draft_model` in its config table), through the official SDK. Greedy answers equal those
of the 1.5B without speculation (a profile turns it off); the prefix cache keeps both
models' KV, so a second turn and a turn after a full restart (the blocks from SSD) start
from the cache and answer the same; a draft whose vocabulary differs (the 0.5B for
SmolLM2) is refused at load with a clear error, and the service serves on."""

from __future__ import annotations

import os
from pathlib import Path

import openai
import pytest

from tests.integration.service import Service

pytestmark = pytest.mark.timeout(900)

TARGET, DRAFT, SMOL = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "SmolLM2-135M-Instruct"
# the SmolLM2 refusal must come back as an HTTP status: a request that waits for its model
# longer than sse_keepalive_s has its 200 sent (with keep-alives) before the load fails,
# which a busy machine reached (an 11 s load under CI's load, against the default 10 s)
CONFIG = f"""
sse_keepalive_s = 300.0

[models."{TARGET}"]
draft_model = "{DRAFT}"

[models."{SMOL}"]
draft_model = "{DRAFT}"

[profiles."{TARGET}:plain"]
speculation = "off"
"""
CODE = "\n".join(f"def step_{i}(total):\n    total = total + {i}\n    return total\n" for i in range(12))
ASK = [{"role": "system", "content": "You are a careful coding assistant."},
       {"role": "user", "content": "Rename `total` to `acc` in this code and return the whole file:\n" + CODE}]


@pytest.fixture(scope="module")
def model_dir(qwen_1_5b_model_dir: Path, qwen_model_dir: Path, default_model_dir: Path,
              tmp_path_factory: pytest.TempPathFactory) -> Path:
    models = tmp_path_factory.mktemp("models")
    for name, path in ((TARGET, qwen_1_5b_model_dir), (DRAFT, qwen_model_dir), (SMOL, default_model_dir)):
        os.symlink(path, models / name)
    return models


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("home")
    (home / "config.toml").write_text(CONFIG)
    return home


def start(model_dir: Path, home: Path) -> Service:
    svc = Service(["--model-dir", str(model_dir), "--model", TARGET], home=home)
    svc.wait_ready()
    return svc


def ask(svc: Service, model: str, max_tokens: int = 48) -> openai.types.chat.ChatCompletion:
    client = openai.OpenAI(base_url=f"{svc.base_url}/v1", api_key="unused", max_retries=0, timeout=600)
    return client.chat.completions.create(model=model, messages=ASK, max_tokens=max_tokens, temperature=0)


def test_drafted_answers_equal_plain_ones_and_the_cache_holds_both_models(model_dir: Path, home: Path) -> None:
    svc = start(model_dir, home)
    try:
        plain = ask(svc, f"{TARGET}:plain")  # no drafts; it fills the cache both models share
        drafted = ask(svc, TARGET)
        assert drafted.choices[0].message.content == plain.choices[0].message.content
        assert drafted.model_extra["mlxd"]["timings"]["draft_tokens"] > 0  # it speculated
        cached = drafted.usage.prompt_tokens_details.cached_tokens
        assert cached >= drafted.usage.prompt_tokens - 32, "the second turn recomputed its prompt"
        svc.wait_for_log(f"draft model {DRAFT} loaded beside it")
    finally:
        svc.stop()
    svc = start(model_dir, home)  # a full restart: the hot tier is gone, the blocks are on SSD
    try:
        again = ask(svc, TARGET)
        assert again.choices[0].message.content == plain.choices[0].message.content
        assert again.model_extra["mlxd"]["cache"]["cold_tokens"] >= 256
        with pytest.raises(openai.APIStatusError) as err:
            ask(svc, SMOL, max_tokens=4)
        assert "vocabulary differs" in err.value.message, err.value.message
        assert ask(svc, TARGET, max_tokens=4).choices[0].message.content  # serving on
    finally:
        svc.stop()
