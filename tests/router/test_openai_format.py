"""router.openai_format and router.sse: the exact wire shapes of chunks, bodies and events."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from protocol.messages import Timings, Usage
from router.api.openai_format import (
    completion_body,
    model_card,
    stream_chunk,
    timings_extension,
    usage_body,
    usage_chunk,
)
from router.sse import DONE, KEEPALIVE, KeepAliveTimer, sse_data

USAGE = Usage(prompt_tokens=10, completion_tokens=3, cached_tokens=8)


def test_usage_body() -> None:
    assert usage_body(USAGE) == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13,
                                 "prompt_tokens_details": {"cached_tokens": 8},
                                 "completion_tokens_details": {"reasoning_tokens": 0}}


@pytest.mark.parametrize("kwargs, choice", [
    ({"role": "assistant", "text": ""},
     {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}),
    ({"text": "Hi"}, {"index": 0, "delta": {"content": "Hi"}, "logprobs": None, "finish_reason": None}),
    ({"finish_reason": "stop"}, {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}),
])
def test_chat_chunk(kwargs: dict[str, Any], choice: dict[str, Any]) -> None:
    chunk = stream_chunk("chat", "chatcmpl-1", "m", 123, **kwargs)
    assert chunk == {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 123, "model": "m",
                     "choices": [choice]}


@pytest.mark.parametrize("kwargs, choice", [
    ({"text": "Hi"}, {"index": 0, "text": "Hi", "logprobs": None, "finish_reason": None}),
    ({"text": "", "finish_reason": "length"}, {"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}),
])
def test_text_chunk(kwargs: dict[str, Any], choice: dict[str, Any]) -> None:
    chunk = stream_chunk("text", "cmpl-1", "m", 1, **kwargs)
    assert chunk["object"] == "text_completion" and chunk["choices"] == [choice]


@pytest.mark.parametrize("kind, object_type", [("chat", "chat.completion.chunk"), ("text", "text_completion")])
def test_include_usage_adds_null_usage_then_a_usage_chunk(kind: str, object_type: str) -> None:
    assert stream_chunk(kind, "x", "m", 1, text="a", include_usage=True)["usage"] is None
    assert "usage" not in stream_chunk(kind, "x", "m", 1, text="a")
    last = usage_chunk(kind, "x", "m", 1, USAGE)
    assert last["object"] == object_type and last["choices"] == [] and last["usage"]["total_tokens"] == 13


@pytest.mark.parametrize("kind, object_type, choice", [
    ("chat", "chat.completion", {"index": 0, "message": {"role": "assistant", "content": "Paris."},
                                 "logprobs": None, "finish_reason": "stop"}),
    ("text", "text_completion", {"index": 0, "text": "Paris.", "logprobs": None, "finish_reason": "stop"}),
])
def test_completion_body(kind: str, object_type: str, choice: dict[str, Any]) -> None:
    body = completion_body(kind, "id-1", "m", 5, "Paris.", "stop", USAGE)
    assert body == {"id": "id-1", "object": object_type, "created": 5, "model": "m", "choices": [choice],
                    "usage": usage_body(USAGE)}


def test_model_card() -> None:
    assert model_card("SmolLM2", 7, state="ready") == {"id": "SmolLM2", "object": "model", "created": 7,
                                                      "owned_by": "mlxd", "state": "ready"}


@pytest.mark.parametrize("payload", [{"a": "line1\nline2"}, {"t": "é 日本"}, {"x": [1, None, True]}])
def test_sse_data_is_one_event(payload: dict[str, Any]) -> None:
    frame = sse_data(payload)
    assert frame.startswith(b"data: ") and frame.endswith(b"\n\n") and frame.count(b"\n") == 2
    assert json.loads(frame[len(b"data: "):]) == payload


def test_sse_constants() -> None:
    assert KEEPALIVE == b": keep-alive\n\n"
    assert DONE == b"data: [DONE]\n\n"


def test_keepalive_timer_counts_from_last_write() -> None:
    timer = KeepAliveTimer(0.2)
    assert 0.1 < timer.remaining() <= 0.2
    time.sleep(0.25)
    assert timer.remaining() == 0.0
    timer.wrote()
    assert timer.remaining() > 0.1


def test_the_cache_block_says_why_tokens_missed() -> None:
    from protocol.cache_misses import CacheMisses, Divergence
    from protocol.messages import Timings, Usage
    from router.api.openai_format import timings_extension

    misses = CacheMisses({"diverged": 545}, 0, Divergence(2071, 3, "user", "content"))
    cache = timings_extension(Timings(), Usage(2593, 3, 2048, misses=misses))["cache"]
    assert cache["uncached_tokens"] == 545
    assert cache["miss_reasons"] == {"evicted": 0, "diverged": 545, "first_seen": 0, "cache_salt": 0,
                                     "model_changed": 0, "partial_block": 0, "evicted_hot_found_cold": 0}
    assert cache["divergence"] == {"token": 2071, "message_index": 3, "role": "user", "field": "content"}
    assert timings_extension(Timings(), Usage(5, 1))["cache"]["miss_reasons"] is None  # no prefix cache


def test_the_mlxd_block_says_cold_and_keeps_the_old_ssd_names_until_0_2() -> None:
    extension = timings_extension(Timings(cold_fetch_s=0.25), Usage(1000, 5, 768, 512, 512_000))
    cache, timings = extension["cache"], extension["timings"]
    assert (cache["cold_tokens"], cache["cold_bytes"], timings["cold_fetch_s"]) == (512, 512_000, 0.25)
    assert (cache["ssd_tokens"], cache["ssd_bytes"], timings["ssd_fetch_s"]) == (512, 512_000, 0.25)
    assert cache["uncached_tokens"] == 232
