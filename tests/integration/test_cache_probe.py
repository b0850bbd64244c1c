"""`POST /admin/cache/probe` against the real service on the real default model: its
hot / SSD / missing split is what the request that follows it is served (a hot hit, an
SSD hit after a worker restart, a miss), in every API's shape, and probing changes no
LRU order (checked by eviction, with a request in the probe's place as the control)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.integration.service import Service, kv_block_bytes

pytestmark = pytest.mark.timeout(600)

BLOCK = 64  # small blocks: short prompts fill several


@pytest.fixture(scope="module")
def service(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    # 7.5 blocks: the eviction test below counts on it
    hot = int(7.5 * kv_block_bytes(default_model_dir, BLOCK))
    svc = Service(["--model", str(default_model_dir), "--block-tokens", str(BLOCK), "--hot-tier-bytes", str(hot)],
                  home=tmp_path_factory.mktemp("home"))
    try:
        svc.wait_ready()
        assert svc.health()["workers"]["SmolLM2-135M-Instruct"]["dtype"] == "float32", "block_bytes assumes float32"
        yield svc
    finally:
        svc.stop()


MODEL = "SmolLM2-135M-Instruct"


def probe(svc: Service, body: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
    r = httpx.post(f"{svc.base_url}/admin/cache/probe", json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    found = r.json()
    assert found["hot_tokens"] + found["cold_tokens"] + found["missing_tokens"] == found["prompt_tokens"]
    assert found["cached_tokens"] == found["hot_tokens"] + found["cold_tokens"]
    # the old names, until 0.2 (router/old_names.py)
    assert (found["ssd_tokens"], found["ssd_blocks"]) == (found["cold_tokens"], found["cold_blocks"])
    assert all(b["on_ssd"] == b["in_cold_tier"] for b in found["blocks"])
    return found


def system_prompt(topic: str) -> str:
    return f"You are a {topic} assistant. " + " ".join(f"Step {i}: {topic} item {i}, then log it." for i in range(30))


def test_the_split_is_what_the_next_request_gets_hot_cold_and_missed(service: Service) -> None:
    client = openai.OpenAI(base_url=f"{service.base_url}/v1", api_key="x", max_retries=0, timeout=300)
    messages = [{"role": "system", "content": system_prompt("release")}, {"role": "user", "content": "Step 7?"}]
    body = {"model": MODEL, "messages": messages}

    last: dict[str, Any] = {}  # the last answer's mlxd.cache

    def ask() -> tuple[int, int, int]:
        reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
        cache = reply.model_extra["mlxd"]["cache"]
        last.update(cache)
        return reply.usage.prompt_tokens, reply.usage.prompt_tokens_details.cached_tokens, cache["cold_tokens"]

    missed = probe(service, body)
    assert missed["api"] == "chat" and missed["cold_tier"] == "ok"
    assert missed["missing_tokens"] == missed["prompt_tokens"] > 4 * BLOCK
    assert {b["tier"] for b in missed["blocks"]} == {"missing"}
    assert len(missed["blocks"]) == missed["prompt_tokens"] // BLOCK
    assert ask() == (missed["prompt_tokens"], 0, 0)

    hot = probe(service, body)
    assert hot["hot_tokens"] > 4 * BLOCK and hot["cold_tokens"] == 0
    assert hot["hot_tokens"] == hot["hot_blocks"] * BLOCK + hot["tail_tokens"]
    assert all(b["tier"] == "hot" for b in hot["blocks"][: hot["hot_blocks"]])
    assert [b["key"] for b in hot["blocks"]] == [b["key"] for b in missed["blocks"]]
    assert ask() == (hot["prompt_tokens"], hot["cached_tokens"], 0)

    r = httpx.post(f"{service.base_url}/admin/workers/{MODEL}/restart", timeout=300)  # flushes its SSD writes
    assert r.status_code == 200, r.text
    cold = probe(service, body)
    assert cold["hot_tokens"] == 0 and cold["cold_tokens"] == cold["cold_blocks"] * BLOCK > 4 * BLOCK
    assert all(b["tier"] == "cold" and b["in_cold_tier"] for b in cold["blocks"][: cold["cold_blocks"]])
    assert ask() == (cold["prompt_tokens"], cold["cold_tokens"], cold["cold_tokens"])
    # the restart emptied the hot tier: what the cold tier gave back is counted as such, in the probe and the answer
    assert cold["miss_reasons"]["evicted_hot_found_cold"] == cold["cold_tokens"]
    assert last["miss_reasons"]["evicted_hot_found_cold"] == cold["cold_tokens"]
    assert probe(service, body)["hot_tokens"] == hot["hot_tokens"]  # restored: hot again


def test_every_api_shape_is_probed_as_its_request_renders_it(service: Service) -> None:
    system = system_prompt("packaging")
    url = service.base_url
    shapes = [
        ("messages", "/v1/messages", {"system": system, "messages": [{"role": "user", "content": "Step 3?"}],
                                      "max_tokens": 4}, lambda u: u["cache_read_input_tokens"]),
        ("responses", "/v1/responses", {"instructions": system, "input": "Step 4?", "max_output_tokens": 4},
         lambda u: u["input_tokens_details"]["cached_tokens"]),
        ("completions", "/v1/completions", {"prompt": system + " Step 5 is", "max_tokens": 4},
         lambda u: u["prompt_tokens_details"]["cached_tokens"]),
        ("chat", "/v1/chat/completions", {"messages": [{"role": "system", "content": system},
                                                       {"role": "user", "content": "Step 6?"}], "max_tokens": 4},
         lambda u: u["prompt_tokens_details"]["cached_tokens"]),
    ]
    for api, route, fields, cached_of in shapes:
        body = {"model": MODEL, **fields, "temperature": 0}
        for _ in range(2):  # a miss (or what the shapes before left), then a hit
            found = probe(service, body)
            assert found["api"] == api
            r = httpx.post(f"{url}{route}", json=body, headers={"anthropic-version": "2023-06-01"}, timeout=300)
            assert r.status_code == 200, r.text
            assert cached_of(r.json()["usage"]) == found["cached_tokens"], (api, found)
        assert found["hot_tokens"] > 0


def token_prompt(start: int, num_tokens: int) -> list[int]:
    return list(range(start, start + num_tokens))


def complete(svc: Service, prompt: list[int]) -> int:
    r = httpx.post(f"{svc.base_url}/v1/completions", timeout=300,
                   json={"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.parametrize("look", ["probe", "request"], ids=["probe-keeps-the-order", "control-a-request-moves-it"])
def test_a_probe_changes_no_lru_order(service: Service, look: str) -> None:
    """The hot tier holds 7.5 blocks. A and B (3 blocks and a 3-token tail each) fill
    6 of them; then A is looked at, and C (2 blocks) needs room: the least recently used
    prefix loses blocks, from its end (its head stays, usable). Untouched by the probe,
    that is A; had the probe moved A to the young end, as the request in its place does,
    it would be B."""
    r = httpx.post(f"{service.base_url}/admin/cache/clear", json={"model": MODEL}, timeout=120)
    assert r.status_code == 200, r.text
    a, b, c = token_prompt(1000, 3 * BLOCK + 2), token_prompt(5000, 3 * BLOCK + 2), token_prompt(9000, 2 * BLOCK + 2)
    complete(service, a)
    complete(service, b)
    before = probe(service, {"model": MODEL, "prompt": a})
    assert before["hot_blocks"] == 3
    if look == "request":
        assert complete(service, a) == before["cached_tokens"]
    else:
        again = probe(service, {"model": MODEL, "prompt": a})
        assert {k: v for k, v in again.items() if k != "blocks"} == {k: v for k, v in before.items() if k != "blocks"}
    complete(service, c)
    found_a, found_b = probe(service, {"model": MODEL, "prompt": a}), probe(service, {"model": MODEL, "prompt": b})
    evicted, kept = (found_a, found_b) if look == "probe" else (found_b, found_a)
    assert evicted["blocks"][-1]["tier"] == "cold" and evicted["hot_blocks"] < 3, evicted
    assert evicted["blocks"][0]["tier"] == "hot", evicted  # a chain is evicted from its end
    assert kept["hot_blocks"] == 3, kept
    # and the split still says what a request gets: A's blocks from SSD, its tail hot
    assert complete(service, a) == found_a["cached_tokens"]


def test_probe_errors_are_openai_shaped(service: Service) -> None:
    url = f"{service.base_url}/admin/cache/probe"
    cases = [
        ({"model": MODEL}, 400, "messages"),
        ({"model": MODEL, "messages": "hi"}, 400, "messages"),
        ({"model": MODEL, "prompt": "hi", "api": "soap"}, 400, "api"),
        ({"messages": [{"role": "user", "content": "hi"}]}, 400, "model"),
        ({"model": "no-such-model", "prompt": "hi"}, 404, "model"),
    ]
    for body, status, param in cases:
        r = httpx.post(url, json=body, timeout=60)
        assert r.status_code == status, (body, r.text)
        error = r.json()["error"]
        assert error["param"] == param and error["type"] and error["message"], r.text
    r = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
