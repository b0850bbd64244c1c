"""The caps a user expects, against the real service: body size, number of messages and
prompt tokens get clear 413/400s in each API's shape, and a client that stops reading its
stream neither blocks another client nor keeps its request decoding past
`stream_send_timeout_s`."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.integration.service import Service

pytestmark = pytest.mark.timeout(300)

MAX_MESSAGES = 4
MAX_PROMPT_TOKENS = 120
MAX_BODY = 64 << 10
SEND_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def svc(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    service = Service(["--model", str(default_model_dir), "--max-messages", str(MAX_MESSAGES),
                       "--max-prompt-tokens", str(MAX_PROMPT_TOKENS), "--max-body-bytes", str(MAX_BODY),
                       "--stream-send-timeout-s", str(SEND_TIMEOUT_S)], home=tmp_path_factory.mktemp("home"))
    try:
        service.wait_ready()
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="module")
def model(svc: Service) -> str:
    return httpx.get(f"{svc.base_url}/v1/models", timeout=10).json()["data"][0]["id"]


def turns(num: int) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(num)]


def test_a_body_over_the_cap_is_a_413_in_each_shape(svc: Service, model: str) -> None:
    big = "x" * (MAX_BODY + 1)
    chat = httpx.post(f"{svc.base_url}/v1/chat/completions", timeout=30,
                      json={"model": model, "messages": [{"role": "user", "content": big}]})
    assert chat.status_code == 413, chat.text
    assert chat.json()["error"]["code"] == "request_too_large" and "max_body_bytes" in chat.json()["error"]["message"]
    claude = anthropic.Anthropic(base_url=svc.base_url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as raised:
        claude.messages.create(model=model, max_tokens=4, messages=[{"role": "user", "content": big}])
    assert raised.value.status_code == 413
    assert raised.value.body["type"] == "error" and raised.value.body["error"]["type"] == "request_too_large"


def test_too_many_messages_is_a_400_naming_the_setting(svc: Service, model: str) -> None:
    client = openai.OpenAI(base_url=f"{svc.base_url}/v1", api_key="x", max_retries=0)
    assert client.chat.completions.create(model=model, messages=turns(MAX_MESSAGES - 1), max_tokens=2).choices
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=model, messages=turns(MAX_MESSAGES + 1), max_tokens=2)
    error = raised.value.body
    assert error["code"] == "too_many_messages" and error["param"] == "messages"
    assert f"{MAX_MESSAGES + 1} messages" in error["message"] and "max_messages" in error["message"]
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=model, input=turns(MAX_MESSAGES + 1), max_output_tokens=2)
    claude = anthropic.Anthropic(base_url=svc.base_url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(model=model, max_tokens=2, messages=turns(MAX_MESSAGES + 1))
    assert refused.value.body["error"]["type"] == "invalid_request_error"
    assert "max_messages" in refused.value.body["error"]["message"]


def test_a_prompt_over_the_token_cap_is_refused_like_a_full_window(svc: Service, model: str) -> None:
    client = openai.OpenAI(base_url=f"{svc.base_url}/v1", api_key="x", max_retries=0)
    long_text = " ".join(f"word{i}" for i in range(200))
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": long_text}], max_tokens=2)
    assert raised.value.body["code"] == "context_length_exceeded"
    assert f"than the {MAX_PROMPT_TOKENS}" in raised.value.body["message"]
    claude = anthropic.Anthropic(base_url=svc.base_url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(model=model, max_tokens=2, messages=[{"role": "user", "content": long_text}])
    # the phrase and numbers Claude Code compacts on
    assert refused.value.body["error"]["message"].startswith("prompt is too long: ")
    assert refused.value.body["error"]["message"].endswith(f" > {MAX_PROMPT_TOKENS} maximum")
    short = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert short.usage.prompt_tokens <= MAX_PROMPT_TOKENS


def _stalled_stream(svc: Service, model: str) -> socket.socket:
    """A raw client that asks for a long stream with large chunks and then reads nothing."""
    body = json.dumps({"model": model, "stream": True, "max_tokens": 3000, "temperature": 0, "logprobs": True,
                       "top_logprobs": 20, "messages": [{"role": "user", "content": "Write a very long story."}]})
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel holds little for it
    sock.connect(("127.0.0.1", svc.port))
    sock.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
    assert sock.recv(64).startswith(b"HTTP/1.1 200")
    return sock


def _requests(svc: Service) -> list[dict]:
    return httpx.get(f"{svc.base_url}/admin/status", timeout=10).json()["requests"]


def test_a_client_that_stops_reading_blocks_nobody_and_is_cancelled(svc: Service, model: str) -> None:
    log_start = len(svc.log)
    sock = _stalled_stream(svc, model)
    try:
        deadline = time.monotonic() + 60
        while not _requests(svc):  # it decodes
            assert time.monotonic() < deadline
            time.sleep(0.1)
        # another client is served normally meanwhile
        client = openai.OpenAI(base_url=f"{svc.base_url}/v1", api_key="x", max_retries=0, timeout=60)
        started = time.monotonic()
        other = client.chat.completions.create(model=model, temperature=0, max_tokens=16,
                                               messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert "Paris" in other.choices[0].message.content and time.monotonic() - started < 30
        # the stalled request is cancelled once its writes wait SEND_TIMEOUT_S: far before 3000 tokens
        while _requests(svc):
            assert time.monotonic() < deadline, f"the stalled stream was never cancelled: {_requests(svc)}"
            time.sleep(0.2)
        cancelled = [line for line in list(svc.log)[log_start:] if "stream_send_timeout_s" in line]
        assert cancelled, "\n".join(list(svc.log)[log_start:])
        assert "Traceback" not in "\n".join(list(svc.log)[log_start:])
    finally:
        sock.close()
    assert svc.health()["status"] == "ok"
