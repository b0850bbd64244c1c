"""The stable_first prompt layout through the real service on Qwen2.5-Coder-0.5B: a session
in another "project" (another system text, the same ~1.7K tokens of Codex's tools) reads
the tools from the prefix cache; laid out as the template does (a profile with
`prompt_layout = "template"`), it would recompute them (the cache probe says so, computing
nothing)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import transformers

from tests.integration.service import Service, running_service

pytestmark = pytest.mark.timeout(1800)  # two cold prefills of ~1.8K tokens on Qwen 0.5B

MODEL = "qwen2.5-coder-0.5b"
TEMPLATE_PROFILE = f"{MODEL}:template"
CLIENTS = Path(__file__).resolve().parents[1] / "clients"
BLOCK_TOKENS = 256  # the default: only full blocks are cached


def codex_tools() -> list[dict[str, Any]]:
    """Codex's seven function tools as captured, in Chat Completions' shape."""
    body = json.loads((CLIENTS / "codex-cli-responses-first-turn.json").read_text())["body"]
    return [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                              "parameters": t["parameters"]}}
            for t in body["tools"] if t["type"] == "function"]


def system_text(project: str) -> str:
    """A system text that names its project in its first line, as agents' do."""
    return (f"You are a coding agent working in /home/dev/{project}.\n"
            + "Read files before editing them, keep changes small, and run the tests afterwards.\n" * 4)


@pytest.fixture(scope="module")
def service(qwen_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    home = tmp_path_factory.mktemp("home")
    config = home / "config.toml"
    config.write_text(f'[profiles."{TEMPLATE_PROFILE}"]\nprompt_layout = "template"\n')
    with running_service(["--model", str(qwen_model_dir), "--config", str(config)], home) as svc:
        yield svc


def body(model: str, project: str) -> dict[str, Any]:
    return {"model": model, "max_tokens": 1, "temperature": 0, "tools": codex_tools(),
            "messages": [{"role": "system", "content": system_text(project)},
                         {"role": "user", "content": "What does this repository do?"}]}


def send(service: Service, model: str, project: str) -> tuple[int, int]:
    """(prompt tokens, cached tokens) of a first request in `project`."""
    response = httpx.post(f"{service.base_url}/v1/chat/completions", json=body(model, project), timeout=1800)
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    return usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


def probe(service: Service, model: str, project: str) -> int:
    """The tokens a first request in `project` would read from the cache (computing nothing)."""
    response = httpx.post(f"{service.base_url}/admin/cache/probe", json=body(model, project), timeout=600)
    assert response.status_code == 200, response.text
    return response.json()["cached_tokens"]


def test_another_project_reads_the_tools_from_the_cache(service: Service, qwen_model_dir: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(qwen_model_dir)
    tools_tokens = len(tokenizer.encode("\n".join(json.dumps(t) for t in codex_tools()), add_special_tokens=False))
    assert tools_tokens > 4 * BLOCK_TOKENS

    send(service, MODEL, "alpha")
    prompt_tokens, cached = send(service, MODEL, "beta")
    assert cached >= tools_tokens - BLOCK_TOKENS  # every full block of the tools
    assert cached <= prompt_tokens - len(tokenizer.encode(system_text("beta"), add_special_tokens=False))

    # laid out as the template does, the same two projects share nothing (the template
    # session's second request is probed, not run: it would recompute everything)
    prompt_tokens, _ = send(service, TEMPLATE_PROFILE, "alpha")
    assert probe(service, TEMPLATE_PROFILE, "alpha") >= prompt_tokens - BLOCK_TOKENS  # its own blocks are cached
    assert probe(service, TEMPLATE_PROFILE, "beta") == 0  # the prompts differ within their first block


def test_the_layout_in_use_is_reported(service: Service) -> None:
    worker = service.health()["workers"][MODEL]
    assert (worker["tool_dialect"], worker["prompt_layout"]) == ("hermes", "stable_first")
    cards = {card["id"]: card for card in httpx.get(f"{service.base_url}/v1/models", timeout=10).json()["data"]}
    assert cards[MODEL]["prompt_layout"] == "stable_first"
    assert cards[TEMPLATE_PROFILE]["prompt_layout"] == "template"
    status = httpx.get(f"{service.base_url}/admin/status", timeout=10).json()
    assert [m["prompt_layout"] for m in status["models"] if m["id"] == MODEL] == ["stable_first"]
    assert "prompts with tools laid out stable_first" in service.log_text()
