"""router.openai_api through the real router (uvicorn + ZeroMQ) in front of a fake worker."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.router.router_harness import MODEL_ID, RunningRouter, start_router

pytestmark = pytest.mark.timeout(60)

CHAT = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}]}
REPLY = "Hello from the fake worker ."


def sse_events(response: httpx.Response) -> tuple[list[Any], list[str]]:
    """(data payloads, comment lines) of an SSE response."""
    data, comments = [], []
    for line in response.iter_lines():
        if line.startswith("data: "):
            payload = line[len("data: "):]
            data.append(payload if payload == "[DONE]" else json.loads(payload))
        elif line.startswith(":"):
            comments.append(line)
    return data, comments


def test_health_and_models(router: RunningRouter) -> None:
    with router.client() as client:
        health = client.get("/health")
        assert health.status_code == 200
        worker = health.json()["workers"][MODEL_ID]
        assert health.json()["status"] == "ok" and worker["state"] == "ready" and worker["pid"] > 0
        assert worker["restarts"] == 0 and worker["last_error"] is None
        models = client.get("/v1/models").json()
        assert models["object"] == "list"
        # the chat model first, then the default embedding model, listed before it is fetched
        assert [(m["id"], m["object"], m["owned_by"], m["kind"]) for m in models["data"]] == [
            (MODEL_ID, "model", "mlxd", "chat"), ("all-MiniLM-L6-v2", "model", "mlxd", "embedding")]
        assert models["data"][1]["state"] == "unloaded" and models["data"][1]["rerank_method"] == "cosine"
        assert client.get(f"/v1/models/{MODEL_ID}").json()["id"] == MODEL_ID
        missing = client.get("/v1/models/nope")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_chat_non_streaming(router: RunningRouter) -> None:
    with router.client() as client:
        body = client.post("/v1/chat/completions", json=CHAT).json()
    assert body["object"] == "chat.completion" and body["model"] == MODEL_ID
    assert body["choices"][0]["message"] == {"role": "assistant", "content": REPLY}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 1, "completion_tokens": 6, "total_tokens": 7,
                             "prompt_tokens_details": {"cached_tokens": 1},
                             "completion_tokens_details": {"reasoning_tokens": 0}}


def test_answers_carry_the_request_id_of_the_log_lines(router: RunningRouter) -> None:
    with router.client() as client:
        whole = client.post("/v1/chat/completions", json=CHAT)
        with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as streamed:
            data, _ = sse_events(streamed)
        unparsed = client.post("/v1/chat/completions", json={"model": MODEL_ID})
    assert whole.headers["x-request-id"] == whole.json()["id"]
    assert streamed.headers["x-request-id"] == data[0]["id"]
    assert "x-request-id" not in unparsed.headers  # refused before it had an id


def test_completion_non_streaming_length(router: RunningRouter) -> None:
    with router.client() as client:
        body = client.post("/v1/completions", json={"model": MODEL_ID, "prompt": ["STOP"]}).json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == "Hello from" and body["choices"][0]["finish_reason"] == "length"


def test_chat_streaming_with_usage(router: RunningRouter) -> None:
    request = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    with router.client() as client, client.stream("POST", "/v1/chat/completions", json=request) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        data, _ = sse_events(response)
    assert data[-1] == "[DONE]"
    chunks = data[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1]) == REPLY
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop" and chunks[-2]["choices"][0]["delta"] == {}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 7
    assert all(c["usage"] is None for c in chunks[:-1])


def test_completion_streaming(router: RunningRouter) -> None:
    request = {"model": MODEL_ID, "prompt": "hi", "stream": True}
    with router.client() as client, client.stream("POST", "/v1/completions", json=request) as response:
        data, _ = sse_events(response)
    assert data[-1] == "[DONE]"
    assert "".join(c["choices"][0]["text"] for c in data[:-1]) == REPLY
    assert data[-2]["choices"][0]["finish_reason"] == "stop"
    assert all(c["object"] == "text_completion" and "usage" not in c for c in data[:-1])


def test_keepalive_comments_while_waiting_for_the_first_token(router: RunningRouter) -> None:
    # the fake worker holds a SLOW request 1.5 s before its first token; keep-alive is 0.3 s
    request = {**CHAT, "messages": [{"role": "user", "content": "SLOW"}], "stream": True}
    with router.client() as client, client.stream("POST", "/v1/chat/completions", json=request) as response:
        data, comments = sse_events(response)
    assert data[-1] == "[DONE]"
    assert len(comments) >= 2 and set(comments) == {": keep-alive"}


def test_worker_error_before_stream_is_an_http_error(router: RunningRouter) -> None:
    request = {**CHAT, "messages": [{"role": "user", "content": "TOOLONG"}]}
    with router.client() as client:
        for stream in (False, True):
            response = client.post("/v1/chat/completions", json={**request, "stream": stream})
            assert response.status_code == 400
            assert response.json()["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize("path, body, status, param", [
    ("/v1/chat/completions", {**CHAT, "model": "nope"}, 404, "model"),
    ("/v1/chat/completions", {**CHAT, "n": 2}, 400, "n"),
    ("/v1/chat/completions", {**CHAT, "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"model": MODEL_ID}, 400, "prompt"),
])
def test_bad_requests_then_a_good_one(router: RunningRouter, path: str, body: dict[str, Any], status: int,
                                      param: str) -> None:
    with router.client() as client:
        response = client.post(path, json=body)
        assert response.status_code == status and response.json()["error"]["param"] == param
        malformed = client.post(path, content=b"{not json", headers={"content-type": "application/json"})
        assert malformed.status_code == 400 and "JSON" in malformed.json()["error"]["message"]
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_unknown_route_and_method_are_json(router: RunningRouter) -> None:
    with router.client() as client:
        assert client.get("/v2/nothing").json()["error"]["type"] == "not_found_error"
        wrong = client.get("/v1/chat/completions")
        assert wrong.status_code == 405 and "error" in wrong.json()


@pytest.fixture
def slow_router(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningRouter]:
    # SLOW requests wait 30 s for their first token: long enough to hang up on them
    yield from start_router(model_dir, monkeypatch, worker_env={"FAKE_WORKER_SLOW_S": "30"})


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_aborts_the_request(slow_router: RunningRouter, stream: bool,
                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    request = {**CHAT, "messages": [{"role": "user", "content": "SLOW"}], "stream": stream}
    client = httpx.Client(base_url=slow_router.url, timeout=1.0)
    if stream:  # read until the first keep-alive, then hang up
        with client.stream("POST", "/v1/chat/completions", json=request) as response:
            for line in response.iter_lines():
                if line == ": keep-alive":
                    assert slow_router.supervisor.health()["num_requests"] == 1
                    break  # closes the connection
    else:  # the body starts with keep-alive whitespace; hang up after the first
        with client.stream("POST", "/v1/chat/completions", json=request) as response:
            assert response.status_code == 200
            for piece in response.iter_bytes():
                assert piece.strip() == b""
                assert slow_router.supervisor.health()["num_requests"] == 1
                break
    client.close()
    slow_router.wait_for(lambda: slow_router.supervisor.health()["num_requests"] == 0, timeout=3)
    slow_router.wait_for(lambda: "fake worker: aborted chatcmpl-" in caplog.text, timeout=3)
    with slow_router.client() as again:
        assert again.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_slow_non_streaming_answer_is_padded_json(router: RunningRouter) -> None:
    """Past one keep-alive interval, a non-streamed answer arrives as whitespace + JSON."""
    slow = {**CHAT, "messages": [{"role": "user", "content": "SLOW"}]}
    with router.client() as client:
        response = client.post("/v1/chat/completions", json=slow)
    assert response.status_code == 200
    assert response.content.startswith(b" ")
    assert response.json()["choices"][0]["message"]["content"] == REPLY


def test_openai_sdk(router: RunningRouter) -> None:
    sdk = openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0)
    reply = sdk.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == REPLY and reply.usage.total_tokens == 7
    parts = [c.choices[0].delta.content or "" for c in sdk.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], stream=True) if c.choices]
    assert "".join(parts) == REPLY
    with pytest.raises(openai.NotFoundError):
        sdk.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert [m.id for m in sdk.models.list()] == [MODEL_ID, "all-MiniLM-L6-v2"]  # chat first, then the embedder


def test_concurrent_requests(router: RunningRouter) -> None:
    import concurrent.futures

    def one(i: int) -> str:
        with router.client() as client:
            return client.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]["content"]

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(8) as executor:
        assert list(executor.map(one, range(16))) == [REPLY] * 16
    assert time.monotonic() - started < 10
