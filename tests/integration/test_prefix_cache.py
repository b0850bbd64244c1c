"""The hot tier on the real default model, through the real service."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

pytestmark = pytest.mark.timeout(600)
SALT = __name__  # this module's cache salts: no other module on the shared service uses them

SYSTEM = ("You are a coding agent with these tools. " +
          " ".join(f"Tool {i}: read_file_{i}(path) returns the lines of file {i}." for i in range(45)))


def convo(question: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


@pytest.fixture(scope="module")
def client(service) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{service.base_url}/v1", api_key="x", max_retries=0, timeout=300)


def ask(client, model_id, messages, **extra):
    return client.chat.completions.create(model=model_id, messages=messages, temperature=0, max_tokens=24, **extra)


def test_repeated_prefix_hits_and_answers_the_same(client, model_id, service) -> None:
    mark = service.log_mark()
    cold = ask(client, model_id, convo("Which tool reads file 7?"), extra_body={"cache_salt": f"{SALT}-t1"})
    warm = ask(client, model_id, convo("Which tool reads file 7?"), extra_body={"cache_salt": f"{SALT}-t1"})
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    cached = warm.usage.prompt_tokens_details.cached_tokens
    # whole blocks plus the first request's tail: everything but the last prompt token,
    # which must be recomputed to produce the first logits
    assert cached == warm.usage.prompt_tokens - 1
    assert warm.choices[0].message.content == cold.choices[0].message.content
    service.wait_for_log(f"prefix hit {cached}/{warm.usage.prompt_tokens} tokens", after=mark)


def test_next_turn_hits_the_whole_previous_turn(client, model_id) -> None:
    turn1 = convo("Which tool reads file 3?")
    first = ask(client, model_id, turn1, extra_body={"cache_salt": f"{SALT}-t2"})
    turn2 = turn1 + [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "And file 4?"}]
    second = ask(client, model_id, turn2, extra_body={"cache_salt": f"{SALT}-t2"})
    fresh = ask(client, model_id, turn2, extra_body={"cache_salt": f"{SALT}-t2-fresh"})
    assert second.choices[0].message.content == fresh.choices[0].message.content
    assert fresh.usage.prompt_tokens_details.cached_tokens == 0
    # turn 1's prompt and answer, up to where the re-rendered history first differs
    assert second.usage.prompt_tokens_details.cached_tokens > first.usage.prompt_tokens


def test_cancel_mid_prefill_keeps_completed_blocks(model_id, service) -> None:
    long = convo("Summarize: " + " ".join(f"line {i} of the log" for i in range(120)))
    body = {"model": model_id, "messages": long, "max_tokens": 8, "temperature": 0, "stream": True,
            "cache_salt": f"{SALT}-t3", "mlxd": {"progress": True}}
    processed = total = 0
    with httpx.stream("POST", f"{service.base_url}/v1/chat/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                progress = json.loads(line[6:]).get("mlxd", {}).get("progress")
                if progress:
                    processed, total = progress["processed_tokens"], progress["total_tokens"]
                    assert total > 1024
                    if processed >= 512:
                        break  # hang up mid-prefill
    assert 512 <= processed < total
    retry = httpx.post(f"{service.base_url}/v1/chat/completions",
                       json={**body, "stream": False, "mlxd": None}, timeout=300).json()
    assert retry["usage"]["prompt_tokens"] == total
    assert retry["usage"]["prompt_tokens_details"]["cached_tokens"] >= (processed // 256) * 256
