"""The output budget: a request without max_tokens gets the rest of its window, and every
request is clamped to the server's cap (never refused for asking too much)."""

from __future__ import annotations

import logging

import pytest

from protocol.errors import RequestError
from protocol.messages import AddRequest, SamplingParams
from worker.request_limits import check_prompt_cap, max_new_tokens


def request(max_tokens: int | None = None, cap: int | None = None) -> AddRequest:
    return AddRequest("r1", prompt="x", sampling=SamplingParams(max_tokens=max_tokens), max_output_tokens=cap)


@pytest.mark.parametrize(("max_tokens", "cap", "worker_cap", "expected"), [
    (None, None, 4096, 900),  # no limit asked: the rest of the window (prompt 100 of 1000)
    (None, None, 500, 500),  # ... up to the worker's cap
    (None, 300, 500, 300),  # ... or the model's / profile's tighter one
    (None, 800, 500, 500),  # a request's cap never raises the worker's
    (32000, None, 4096, 900),  # more than the room: the room
    (32000, None, 600, 600),  # more than the cap: the cap
    (50, 300, 500, 50),  # what it asks, when that fits
])
def test_budget(max_tokens: int | None, cap: int | None, worker_cap: int, expected: int) -> None:
    assert max_new_tokens(request(max_tokens, cap), 100, 1000, worker_cap) == expected


def test_clamping_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="worker.request_limits"):
        assert max_new_tokens(request(128000, 64), 10, 8192, 4096) == 64
    assert "max_tokens 128000 clamped to this model's output cap 64" in caplog.text


def test_no_room_is_the_context_error() -> None:
    with pytest.raises(RequestError) as raised:
        max_new_tokens(request(), 1000, 1000, 4096)
    assert raised.value.code == "context_length_exceeded"


@pytest.mark.parametrize(("num_prompt", "cap", "refused"), [(100, 0, False), (100, 100, False), (101, 100, True)])
def test_prompt_cap(num_prompt: int, cap: int, refused: bool) -> None:
    if not refused:
        check_prompt_cap(request(), num_prompt, cap)
        return
    with pytest.raises(RequestError) as raised:
        check_prompt_cap(request(), num_prompt, cap)
    error = raised.value
    assert error.code == "context_length_exceeded" and "max_prompt_tokens" in error.message
    assert (error.num_prompt_tokens, error.context_window) == (num_prompt, cap)
