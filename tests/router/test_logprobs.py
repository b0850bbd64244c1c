"""router/api/logprobs.py: the request fields, and OpenAI's exact response shapes for chat
and text completions, streamed in pieces or whole."""

from __future__ import annotations

from typing import Any

import pytest

from protocol.messages import SamplingParams, TokenLogprobs
from router.api.logprobs import (
    LogprobsFormatter,
    token_text,
    with_chat_logprobs,
    with_completion_logprobs,
)

HELLO = TokenLogprobs([b"Hello"], [-0.25], [[b"Hello", b"Hi"]], [[-0.25, -1.5]])
WORLD = TokenLogprobs([b" world"], [-0.5], [[b" world", b" there"]], [[-0.5, -2.0]])
# "é" is two bytes; a byte-level tokenizer may split it across two tokens
E_HEAD = TokenLogprobs([b"\xc3"], [-0.125], [[b"\xc3"]], [[-0.125]])
E_TAIL = TokenLogprobs([b"\xa9!"], [-1.0], [[b"\xa9!"]], [[-1.0]])


@pytest.mark.parametrize("body, expected", [
    ({}, (False, 0)),
    ({"logprobs": True}, (True, 0)),
    ({"logprobs": True, "top_logprobs": 20}, (True, 20)),
    ({"logprobs": False, "top_logprobs": 0}, (False, 0)),
])
def test_chat_fields(body: dict[str, Any], expected: tuple[bool, int]) -> None:
    sampling = with_chat_logprobs(SamplingParams(), body)
    assert (sampling.logprobs, sampling.top_logprobs) == expected


@pytest.mark.parametrize("body, expected", [({}, (False, 0)), ({"logprobs": False}, (False, 0)),
                                            ({"logprobs": 0}, (True, 0)), ({"logprobs": 5}, (True, 5))])
def test_completion_field(body: dict[str, Any], expected: tuple[bool, int]) -> None:
    sampling = with_completion_logprobs(SamplingParams(), body)
    assert (sampling.logprobs, sampling.top_logprobs) == expected


def test_token_text_names_partial_characters_by_their_bytes() -> None:
    assert token_text(b" caf\xc3\xa9") == " café"
    assert token_text(b"\xc3") == "bytes:\\xc3"


def test_chat_shape() -> None:
    formatter = LogprobsFormatter("chat")
    formatter.add(HELLO)
    formatter.add(None)  # a token event of a request that got no figures for it
    formatter.add(WORLD)
    assert formatter.take() == {"content": [
        {"token": "Hello", "logprob": -0.25, "bytes": list(b"Hello"),
         "top_logprobs": [{"token": "Hello", "logprob": -0.25, "bytes": list(b"Hello")},
                          {"token": "Hi", "logprob": -1.5, "bytes": list(b"Hi")}]},
        {"token": " world", "logprob": -0.5, "bytes": list(b" world"),
         "top_logprobs": [{"token": " world", "logprob": -0.5, "bytes": list(b" world")},
                          {"token": " there", "logprob": -2.0, "bytes": list(b" there")}]},
    ], "refusal": None}
    assert formatter.take() is None  # nothing held any more


def test_text_shape_offsets_count_characters_across_takes() -> None:
    formatter = LogprobsFormatter("text")
    formatter.add(HELLO)
    first = formatter.take()
    for figures in (WORLD, E_HEAD, E_TAIL):
        formatter.add(figures)
    rest = formatter.take()
    assert first == {"tokens": ["Hello"], "token_logprobs": [-0.25],
                     "top_logprobs": [{"Hello": -0.25, "Hi": -1.5}], "text_offset": [0]}
    assert rest == {
        "tokens": [" world", "bytes:\\xc3", "bytes:\\xa9\\x21"],
        "token_logprobs": [-0.5, -0.125, -1.0],
        "top_logprobs": [{" world": -0.5, " there": -2.0}, {"bytes:\\xc3": -0.125}, {"bytes:\\xa9\\x21": -1.0}],
        # "Hello world" is 11 characters; "é" counts once, when its last byte arrives
        "text_offset": [5, 11, 11],
    }


def test_text_top_logprobs_always_hold_the_sampled_token() -> None:
    formatter = LogprobsFormatter("text")
    formatter.add(TokenLogprobs([b"b"], [-3.0], [[b"a"]], [[-0.1]]))  # sampled, not the most likely
    assert formatter.take()["top_logprobs"] == [{"a": -0.1, "b": -3.0}]


def test_no_formatter_when_not_asked() -> None:
    assert LogprobsFormatter.for_request("chat", SamplingParams()) is None
    assert LogprobsFormatter.for_request("text", SamplingParams(logprobs=True)) is not None
