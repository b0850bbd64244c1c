"""Why a request missed, through the real service on the real default model: each
response's `mlxd.cache`, the log lines, the cache probe and /metrics split the uncached
prompt tokens by reason (first_seen, diverged at the right token and message, cache_salt,
evicted from a hot tier too small with no cold tier)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoTokenizer

from tests.integration.service import Service, kv_block_bytes

pytestmark = pytest.mark.timeout(600)

BLOCK = 16  # small blocks: short prompts fill several
HOT_BLOCKS = 14  # the hot tier holds this many blocks: a few other prompts evict one
MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def service(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    hot = HOT_BLOCKS * kv_block_bytes(default_model_dir, BLOCK)
    svc = Service(["--model", str(default_model_dir), "--block-tokens", str(BLOCK), "--hot-tier-bytes", str(hot),
                   "--no-cold-tier"], home=tmp_path_factory.mktemp("home"))
    try:
        svc.wait_ready()
        assert svc.health()["workers"][MODEL]["dtype"] == "float32", "block_bytes assumes float32"
        yield svc
    finally:
        svc.stop()


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(default_model_dir))


def system_prompt(topic: str) -> str:
    return f"You are a {topic} assistant. " + " ".join(f"Rule {i}: check the {topic} twice." for i in range(6))


def chat(svc: Service, messages: list[dict[str, Any]], salt: str) -> dict[str, Any]:
    body = {"model": MODEL, "messages": messages, "max_tokens": 3, "temperature": 0, "cache_salt": salt}
    r = httpx.post(f"{svc.base_url}/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    answer = r.json()
    cache = answer["mlxd"]["cache"]
    # the reasons split exactly the uncached tokens
    uncached = answer["usage"]["prompt_tokens"] - cache["cached_tokens"]
    assert cache["uncached_tokens"] == uncached
    assert sum(n for reason, n in cache["miss_reasons"].items() if reason != "evicted_hot_found_cold") == uncached
    return answer


def reasons(answer: dict[str, Any]) -> dict[str, int]:
    """The reasons with tokens (zeros left out)."""
    return {k: v for k, v in answer["mlxd"]["cache"]["miss_reasons"].items() if v}


def first_difference(tokenizer: Any, a: list[dict[str, Any]], b: list[dict[str, Any]]) -> int:
    ids_a, ids_b = (tokenizer.encode(tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True),
                                     add_special_tokens=False) for m in (a, b))
    return next(i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y)


def miss_counter(svc: Service) -> dict[str, float]:
    text = httpx.get(f"{svc.base_url}/metrics", timeout=30).text
    return {s.labels["reason"]: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == "mlxd_prefix_miss_tokens_total" and s.labels["model"] == MODEL}


def test_a_first_request_is_first_seen_and_its_repeat_misses_only_the_last_token(service: Service) -> None:
    messages = [{"role": "system", "content": system_prompt("first")}, {"role": "user", "content": "Hi."}]
    salt = uuid.uuid4().hex
    first = chat(service, messages, salt)
    assert reasons(first) == {"first_seen": first["usage"]["prompt_tokens"]}
    assert first["mlxd"]["cache"]["divergence"] is None
    again = chat(service, messages, salt)
    assert reasons(again) == {"partial_block": 1}  # the last prompt token is always computed
    service.wait_for_log("1 uncached: partial_block")


def test_a_different_later_message_diverged_at_its_token_and_message(service: Service, tokenizer: Any) -> None:
    system = {"role": "system", "content": system_prompt("diverging")}
    one = [system, {"role": "user", "content": "Which rule comes first?"}]
    two = [system, {"role": "user", "content": "Which rule comes last?"}]
    salt = uuid.uuid4().hex
    before = miss_counter(service)
    chat(service, one, salt)
    answer = chat(service, two, salt)
    at = first_difference(tokenizer, one, two)
    cached = answer["mlxd"]["cache"]["cached_tokens"]
    assert cached == at // BLOCK * BLOCK  # the whole blocks before the one that differs
    assert reasons(answer) == {"diverged": answer["usage"]["prompt_tokens"] - cached}
    assert answer["mlxd"]["cache"]["divergence"] == {"token": at, "message_index": 1, "role": "user",
                                                     "field": "content"}
    line = f"diverged at token {at} (message 1, user content)"
    log = service.log_text()
    assert f"prefix hit {cached}/{answer['usage']['prompt_tokens']} tokens" in log and line in log
    after = miss_counter(service)
    assert after["diverged"] - before.get("diverged", 0) == answer["usage"]["prompt_tokens"] - cached


def test_the_same_prompt_under_another_salt_is_cache_salt(service: Service) -> None:
    messages = [{"role": "system", "content": system_prompt("salted")}, {"role": "user", "content": "Hello."}]
    chat(service, messages, uuid.uuid4().hex)
    before = miss_counter(service)
    other = chat(service, messages, uuid.uuid4().hex)
    assert reasons(other) == {"cache_salt": other["usage"]["prompt_tokens"]}
    assert miss_counter(service)["cache_salt"] - before.get("cache_salt", 0) == other["usage"]["prompt_tokens"]


def test_blocks_the_small_hot_tier_lost_with_no_cold_tier_are_evicted(service: Service) -> None:
    messages = [{"role": "system", "content": system_prompt("evicted")}, {"role": "user", "content": "Go."}]
    salt = uuid.uuid4().hex
    first = chat(service, messages, salt)
    for topic in ("filler one", "filler two", "filler three"):  # each fills most of the hot tier
        chat(service, [{"role": "system", "content": system_prompt(topic)}, {"role": "user", "content": "Go."}],
             uuid.uuid4().hex)
    again = chat(service, messages, salt)
    prompt = first["usage"]["prompt_tokens"]
    assert again["mlxd"]["cache"]["cached_tokens"] == 0
    assert reasons(again) == {"evicted": prompt - 1, "partial_block": 1}


def test_the_probe_says_why_before_the_request_is_sent(service: Service, tokenizer: Any) -> None:
    system = {"role": "system", "content": system_prompt("probed")}
    one = [system, {"role": "user", "content": "Name the first rule."}]
    two = [system, {"role": "user", "content": "Name the second rule."}]
    salt = uuid.uuid4().hex
    chat(service, one, salt)
    r = httpx.post(f"{service.base_url}/admin/cache/probe",
                   json={"model": MODEL, "messages": two, "cache_salt": salt}, timeout=120)
    assert r.status_code == 200, r.text
    found = r.json()
    at = first_difference(tokenizer, one, two)
    assert {k: v for k, v in found["miss_reasons"].items() if v} == {"diverged": found["missing_tokens"]}
    assert found["divergence"] == {"token": at, "message_index": 1, "role": "user", "field": "content"}
    # what the probe said is what the request gets
    answer = chat(service, two, salt)
    assert answer["mlxd"]["cache"]["miss_reasons"] == found["miss_reasons"]


def test_a_prompt_a_rebuilt_model_computed_before_is_model_changed(default_model_dir: Path, tmp_path: Path) -> None:
    """Served as converted (quantized layers kept), then dequantized (`--dtype float32`):
    another fingerprint under the same model id, so the kvstore's blocks of the first
    cannot serve the second, and the first block's shadow on SSD says why."""
    messages = [{"role": "system", "content": system_prompt("rebuilt")}, {"role": "user", "content": "Go."}]
    served: list[str] = []
    for extra in ([], ["--dtype", "float32"]):
        svc = Service(["--model", str(default_model_dir), "--block-tokens", str(BLOCK), *extra], home=tmp_path)
        try:
            svc.wait_ready()
            served.append(svc.health()["workers"][MODEL]["quantization"])
            answer = chat(svc, messages, "one-tenant")
        finally:
            svc.stop()  # drains: the first block's blocks and shadow reach the kvstore
        expected = "first_seen" if not extra else "model_changed"
        assert reasons(answer) == {expected: answer["usage"]["prompt_tokens"]}, served
    assert served[0] != served[1] == "none"
