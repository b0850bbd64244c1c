"""Anthropic `cache_control` on the real service (SmolLM2, the anthropic SDK): a breakpoint
keeps its prefix in a small hot tier, with the cold tier off, through enough other traffic
to evict it, where the same prompt without the breakpoint is evicted; the usage figures
agree with the worker's own prefix-hit log line; /admin/status shows what breakpoints pin."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tests.integration.service import Service, kv_block_bytes, running_service

pytestmark = pytest.mark.timeout(900)

BLOCK_TOKENS = 64
HOT_TIER_BLOCKS = 16  # the hot tier's size in blocks of this model (measured below, asserted)
FLOOD = 5  # other prompts of ~5 blocks each: more than the tier holds
WORDS = ("amber basil cedar delta ember fjord garnet harbor indigo juniper kestrel lantern meadow "
         "nectar orchid pebble quartz river saffron tundra umber violet willow xenon yarrow zephyr").split()


def text_of(seed: int, num_words: int = 260) -> str:
    """A system prompt of about `num_words` tokens, different from the first word for each seed."""
    words = [WORDS[(seed * 7 + i * (seed % 5 + 1)) % len(WORDS)] for i in range(num_words)]
    return f"Prompt {seed}: " + " ".join(words) + "."


@pytest.fixture(scope="module")
def service(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """A hot tier of a few blocks and no cold tier: only a pin can keep a prefix through
    other traffic. Its byte size comes from the model's block size (fp32 K and V here)."""
    block_bytes = kv_block_bytes(default_model_dir, BLOCK_TOKENS)
    with running_service(["--model", str(default_model_dir), "--no-cold-tier", "--block-tokens", str(BLOCK_TOKENS),
                         "--hot-tier-bytes", str(HOT_TIER_BLOCKS * block_bytes), "--max-output-tokens", "4",
                         "--heartbeat-s", "0.5"], tmp_path_factory.mktemp("home")) as svc:
        yield svc


@pytest.fixture(scope="module")
def client(service: Service) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=service.base_url, api_key="unused", max_retries=0, timeout=600)


@pytest.fixture(scope="module")
def model(service: Service) -> str:
    return httpx.get(f"{service.base_url}/v1/models", timeout=10).json()["data"][0]["id"]


def ask(client: anthropic.Anthropic, model: str, system: str, control: dict[str, Any] | None,
        question: str = "Say hi.") -> Any:
    block: dict[str, Any] = {"type": "text", "text": system}
    if control is not None:
        block["cache_control"] = control
    return client.messages.create(model=model, max_tokens=4, system=[block],
                                  messages=[{"role": "user", "content": question}], extra_body={"temperature": 0})


def flood(client: anthropic.Anthropic, model: str, first_seed: int, count: int) -> None:
    """Other traffic: `count` prompts of ~5 whole blocks each, no breakpoints."""
    for seed in range(first_seed, first_seed + count):
        ask(client, model, text_of(seed), None)


def hot_tier(service: Service, model: str) -> dict[str, Any]:
    time.sleep(1.2)  # a pong or two: the status shows the worker's figures as of its last pong
    status = httpx.get(f"{service.base_url}/admin/status", timeout=10).json()
    (entry,) = [m for m in status["models"] if m["id"] == model]
    return entry["hot_tier"]


def prefix_log(service: Service, request_id: str) -> tuple[int, int, list[int]]:
    """(cached, prompt) tokens from the worker's `prefix hit N/M tokens` line for the
    request, and the breakpoints' token positions from its breakpoint line."""
    deadline = time.monotonic() + 10
    while True:
        text = service.log_text()
        hit = re.search(rf"request {request_id}: prefix hit (\d+)/(\d+) tokens", text)
        points = re.search(rf"request {request_id}: cache breakpoints at prompt tokens \[([\d, ]*)\]", text)
        if hit and points or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert hit is not None and points is not None, text[-3000:]
    return int(hit[1]), int(hit[2]), [int(n) for n in points[1].split(", ") if n]


def test_a_breakpoint_keeps_its_prefix_through_other_traffic(client: anthropic.Anthropic, model: str,
                                                             service: Service) -> None:
    # the negative control first: the same traffic evicts a prefix nobody marked
    unmarked = text_of(1000)
    first = ask(client, model, unmarked, None)
    assert first.usage.cache_read_input_tokens == 0 and first.usage.cache_creation_input_tokens == 0
    assert ask(client, model, unmarked, None, "Say bye.").usage.cache_read_input_tokens >= 4 * BLOCK_TOKENS
    flood(client, model, 2000, FLOOD)
    assert ask(client, model, unmarked, None).usage.cache_read_input_tokens == 0

    system = text_of(3000)
    first = ask(client, model, system, {"type": "ephemeral"})
    usage = first.usage
    assert usage.cache_read_input_tokens == 0 and usage.cache_creation_input_tokens >= 4 * BLOCK_TOKENS
    assert usage.cache_creation.ephemeral_5m_input_tokens == usage.cache_creation_input_tokens
    assert usage.cache_creation.ephemeral_1h_input_tokens == 0
    pinned = hot_tier(service, model)
    points = pinned["breakpoints"]
    assert points["prefixes"] == 1 and points["pinned_blocks"] >= 4 and points["pinned_bytes"] > 0
    block_bytes = points["pinned_bytes"] // points["pinned_blocks"]
    assert pinned["budget_bytes"] // block_bytes == HOT_TIER_BLOCKS  # the tier holds what the test assumes
    assert points["limit_bytes"] == pinned["budget_bytes"] // 2
    flood(client, model, 4000, FLOOD)
    again = ask(client, model, system, {"type": "ephemeral"}, "Say bye.")
    _, _, (position,) = prefix_log(service, again.id)
    assert again.usage.cache_read_input_tokens >= position // BLOCK_TOKENS * BLOCK_TOKENS > 0, again.usage
    assert again.usage.cache_creation_input_tokens < BLOCK_TOKENS  # only the partial block before the point


def test_usage_agrees_with_the_prefix_hit_log(client: anthropic.Anthropic, model: str, service: Service) -> None:
    system = text_of(5000)
    controls = [{"type": "ephemeral", "ttl": "1h"}, {"type": "ephemeral"}]
    for question in ("Say hi.", "Say bye.", "Say bye."):
        # the first system block is held for an hour, the question for five minutes
        response = client.messages.create(
            model=model, max_tokens=4, extra_body={"temperature": 0},
            system=[{"type": "text", "text": system, "cache_control": controls[0]}],
            messages=[{"role": "user", "content": [{"type": "text", "text": question, "cache_control": controls[1]}]}])
        usage = response.usage
        cached, prompt, positions = prefix_log(service, response.id)
        assert len(positions) == 2 and positions[0] < positions[1] <= prompt
        assert usage.cache_read_input_tokens == cached
        assert usage.cache_creation_input_tokens == max(0, positions[1] - cached)
        assert usage.cache_creation.ephemeral_1h_input_tokens == max(0, positions[0] - cached)
        assert (usage.cache_creation.ephemeral_5m_input_tokens + usage.cache_creation.ephemeral_1h_input_tokens
                == usage.cache_creation_input_tokens)
        assert usage.input_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens == prompt
        assert usage.input_tokens > 0  # the generation prompt after the last breakpoint
    # the first request wrote both prefixes; the repeat read them back
    assert usage.cache_read_input_tokens >= positions[1] // BLOCK_TOKENS * BLOCK_TOKENS


def test_a_streamed_answer_reports_the_same_split(model: str, service: Service) -> None:
    body = {"model": model, "max_tokens": 4, "stream": True, "temperature": 0,
            "system": [{"type": "text", "text": text_of(6000), "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": "Say hi."}]}
    starts: list[str] = []
    deltas: list[str] = []
    with httpx.stream("POST", f"{service.base_url}/v1/messages", json=body, timeout=300) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and '"message_start"' in line:
                starts.append(line)
            elif line.startswith("data: ") and '"message_delta"' in line:
                deltas.append(line)
    start = json.loads(starts[0][len("data: "):])["message"]
    final = json.loads(deltas[0][len("data: "):])["usage"]
    cached, prompt, (position,) = prefix_log(service, start["id"])
    for usage in (start["usage"], final):
        assert usage["cache_read_input_tokens"] == cached
        assert usage["cache_creation_input_tokens"] == position - cached > 0
        assert usage["input_tokens"] + usage["cache_creation_input_tokens"] + cached == prompt
