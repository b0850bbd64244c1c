"""One request must never take the service down (issue 11), against the real service.

Every case sends what a hostile or careless client might while another stream runs, then
checks three things: the bad request got a clear error in the API's shape, the stream
alongside finished untouched, and a fixed greedy prompt still gets its first answer (so
the worker, the router's socket tasks and the cache all survived).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.integration.probes import PROBE, STORY, probe, survives
from tests.integration.service import Service

pytestmark = pytest.mark.timeout(300)

@pytest.fixture(scope="module")
def svc(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    service = Service(["--model", str(default_model_dir), "--shutdown-drain-s", "1"],
                      home=tmp_path_factory.mktemp("home"))
    try:
        service.wait_ready()
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="module")
def client(svc: Service) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{svc.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def probe_answer(client: openai.OpenAI, model: str) -> str:
    answer = probe(client, model)
    assert "Paris" in answer
    return answer


def post(svc: Service, path: str, body: bytes | dict, **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{svc.base_url}{path}", content=content, timeout=60,
                      headers={"content-type": "application/json", **headers})


def assert_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text[:500]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if param is not None:
        assert error["param"] == param
    return error


def chat_body(model: str, **extra: object) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **extra}


# ---------------------------------------------------------------- defect 1: the wire codec


def test_values_the_wire_cannot_carry_are_400s(svc: Service, client: openai.OpenAI, model: str,
                                               probe_answer: str) -> None:
    deep_tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    node: dict = deep_tool["function"]["parameters"]
    for _ in range(700):
        node["x"] = {}
        node = node["x"]
    cases: list[tuple[bytes | dict, str | None]] = [
        (chat_body(model, max_tokens=2**64), "max_tokens"),
        (chat_body(model, max_completion_tokens=2**70), "max_completion_tokens"),
        (chat_body(model, top_k=2**64), "top_k"),
        (chat_body(model, seed=2**64), "seed"),
        (chat_body(model, tools=[deep_tool]), "tools"),
        (chat_body(model, messages=[{"role": "user", "content": "hi", "extra": 2**80}]), "messages"),
        (chat_body(model, user="a" * 10, metadata={"n": -(2**70)}), "metadata"),
    ]
    surrogate = b'"\\ud800"'
    for field, template in [("content", b'{"model": "M", "messages": [{"role": "user", "content": @S@}]}'),
                            ("stop", b'{"model": "M", "messages": [{"role": "user", "content": "hi"}], "stop": [@S@]}'),
                            ("cache_salt", b'{"model": "M", "messages": [{"role": "user", "content": "hi"}], '
                                           b'"cache_salt": @S@}'),
                            ("tools", b'{"model": "M", "messages": [{"role": "user", "content": "hi"}], "tools": '
                                      b'[{"type": "function", "function": {"name": @S@}}]}'),
                            ("model", b'{"model": @S@, "messages": [{"role": "user", "content": "hi"}]}')]:
        body = template.replace(b'"M"', json.dumps(model).encode()).replace(b"@S@", surrogate)
        cases.append((body, "messages" if field == "content" else field))
    with survives(client, model, probe_answer):
        for body, param in cases:
            assert_error(post(svc, "/v1/chat/completions", body), 400, param)
        assert_error(post(svc, "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 2**64}),
                     400, "max_tokens")
    assert svc.health()["status"] == "ok"


# ---------------------------------------------------------------- defect 2: the worker


def test_a_negative_seed_samples_and_the_worker_lives(svc: Service, client: openai.OpenAI, model: str,
                                                      probe_answer: str) -> None:
    (before,) = svc.health()["workers"].values()
    with survives(client, model, probe_answer):
        answers = []
        for _ in range(2):
            reply = client.chat.completions.create(model=model, messages=PROBE, temperature=1.0, seed=-1,
                                                   max_tokens=6)
            answers.append(reply.choices[0].message.content)
        assert answers[0] == answers[1], "a seed still makes sampling reproducible"
        reply = client.chat.completions.create(model=model, messages=PROBE, temperature=1.0, seed=2**64 - 1,
                                               max_tokens=6)
        assert reply.choices[0].finish_reason == "length"
    (after,) = svc.health()["workers"].values()
    assert after["pid"] == before["pid"] and after["restarts"] == before["restarts"]


def test_logit_bias_outside_the_vocabulary_is_a_400(svc: Service, client: openai.OpenAI, model: str,
                                                    probe_answer: str) -> None:
    (before,) = svc.health()["workers"].values()
    with survives(client, model, probe_answer):
        for token_id in ("2147483647", "100000", "49152"):
            error = assert_error(post(svc, "/v1/chat/completions", chat_body(model, logit_bias={token_id: 5})),
                                 400, "logit_bias")
            assert "49152" in error["message"]  # names the vocabulary size
        # the last id of the vocabulary is fine, and the bias works: forced as the first token
        reply = client.chat.completions.create(model=model, messages=PROBE, temperature=0, max_tokens=1,
                                               logit_bias={"49151": 100})
        assert reply.choices[0].finish_reason == "length"
        assert reply.usage.completion_tokens == 1
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model=model, prompt=[1, 2, 49152], max_tokens=2)
    (after,) = svc.health()["workers"].values()
    assert after["pid"] == before["pid"] and after["restarts"] == before["restarts"]


# ---------------------------------------------------------------- defect 3: big prompts


def test_oversized_bodies_and_prompts_are_refused_before_tokenizing(svc: Service, client: openai.OpenAI,
                                                                    model: str, probe_answer: str) -> None:
    with survives(client, model, probe_answer):
        # over the 8 MiB body cap: a 413 in the API's shape, not text
        huge = json.dumps(chat_body(model, messages=[{"role": "user", "content": "x" * (9 << 20)}])).encode()
        error = assert_error(post(svc, "/v1/chat/completions", huge), 413)
        assert "max_body_bytes" in error["message"]
        # 2 MB of text cannot fit 8192 tokens whatever the tokenizer does: refused unread
        response = post(svc, "/v1/chat/completions",
                        chat_body(model, messages=[{"role": "user", "content": "word " * 400_000}]))
        error = assert_error(response, 400, "messages")
        assert error["code"] == "context_length_exceeded" and "8192" in error["message"]
        # token ids: counted, not tokenized
        response = post(svc, "/v1/completions", {"model": model, "prompt": [1] * 20_000, "max_tokens": 2})
        error = assert_error(response, 400, "prompt")
        assert error["code"] == "context_length_exceeded" and "20000" in error["message"]


def test_tokenizing_a_big_prompt_does_not_stall_other_streams(svc: Service, client: openai.OpenAI,
                                                              model: str, probe_answer: str) -> None:
    """A prompt just under the character bound is tokenized (most of a second) and then
    refused by its token count; meanwhile the stream alongside keeps getting tokens."""
    words = " ".join(f"w{i % 9973}x" for i in range(60_000))  # ~430K chars, ~120K tokens
    with survives(client, model, probe_answer, max_tokens=60) as bystander:
        sent = time.monotonic()
        response = post(svc, "/v1/chat/completions", chat_body(model, messages=[{"role": "user", "content": words}]))
        answered = time.monotonic()
        error = assert_error(response, 400, "messages")
        assert error["code"] == "context_length_exceeded"
        during = [t for t in bystander.times if sent < t < answered]
    logging.getLogger(__name__).info("a %d-char prompt took %.2f s to refuse; the stream alongside got %d tokens "
                                     "meanwhile", len(words), answered - sent, len(during))
    assert len(during) >= 3, (f"the stream alongside got {len(during)} tokens in the {answered - sent:.2f} s "
                              "the big prompt was being tokenized")


# ---------------------------------------------------------------- defect 7: the small ones


def test_malformed_bodies_get_api_shaped_errors(svc: Service, client: openai.OpenAI, model: str,
                                                probe_answer: str) -> None:
    with survives(client, model, probe_answer):
        assert_error(post(svc, "/v1/chat/completions", b"[" * 10_000 + b"]" * 10_000), 400)
        assert_error(post(svc, "/v1/chat/completions", b'{"a": ' * 10_000 + b"1" + b"}" * 10_000), 400)
        assert_error(post(svc, "/v1/chat/completions", chat_body(model, temperature=10**400)), 400, "temperature")
        assert_error(post(svc, "/v1/chat/completions", b'{"model": "m", "temperature": 1e999}'), 400)
        # a lone surrogate in a model name in the URL: a 404 whose body still renders
        response = httpx.post(f"{svc.base_url}/admin/models/%ED%A0%80x/pin", timeout=10)
        assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"


def test_admin_restart_ends_streams_with_a_retry_hint(svc: Service, client: openai.OpenAI, model: str,
                                                      probe_answer: str) -> None:
    """A stream longer than the drain (1 s here) is cut by a restart with worker_unavailable,
    which the SDKs treat as retryable, and the probe answers the same from the new worker."""
    events: list[dict] = []

    def stream_long() -> None:
        with httpx.stream("POST", f"{svc.base_url}/v1/chat/completions", timeout=120,
                          json={"model": model, "messages": STORY, "temperature": 0, "max_tokens": 2000,
                                "stream": True}) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    events.append(json.loads(line[6:]))

    thread = threading.Thread(target=stream_long, daemon=True)
    thread.start()
    while not events:
        time.sleep(0.05)
    restart = httpx.post(f"{svc.base_url}/admin/workers/{model}/restart", timeout=120)
    assert restart.status_code == 200, restart.text
    thread.join(timeout=60)
    errors = [e["error"] for e in events if "error" in e]
    assert errors, "the long stream should have been cut by the restart"
    assert errors[0]["code"] == "worker_unavailable" and "retry" in errors[0]["message"]
    svc.wait_ready()
    assert probe(client, model) == probe_answer
