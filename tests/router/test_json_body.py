"""Request bodies the wire cannot carry are 400s naming the field, before anything else."""

from __future__ import annotations

import json

import pytest

from protocol.errors import RequestError
from router.json_body import MAX_JSON_DEPTH, parse_json_body


def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = {"x": value}
    return value


@pytest.mark.parametrize(("raw", "param", "words"), [
    (b"[" * 10_000 + b"]" * 10_000, None, "nested too deeply"),
    (b'{"a": 1e999}', None, "out of range"),
    (b'{"a": NaN}', None, "not valid JSON"),
    (b'{"a": ' + b"9" * 5000 + b"}", None, "could not parse"),
    (json.dumps({"max_tokens": 2**64}).encode(), "max_tokens", "out of range"),
    (json.dumps({"seed": -(2**63) - 1}).encode(), "seed", "out of range"),
    (json.dumps({"prompt": [1, 2, 2**64]}).encode(), "prompt", "out of range"),
    (json.dumps({"tools": [{"deep": nested(MAX_JSON_DEPTH)}]}).encode(), "tools", "nested too deeply"),
    (b'{"messages": [{"content": "a\\ud800b"}]}', "messages", "surrogate"),
    (b'{"stop": "\\udfff"}', "stop", "surrogate"),
    (b'{"tools": [{"\\ud800": 1}]}', "tools", "surrogate"),
    (b'{"\\ud800": 1}', None, "surrogate"),
    (b"[1, 2]", None, "JSON object"),
])
def test_what_the_wire_cannot_carry_is_a_400(raw: bytes, param: str | None, words: str) -> None:
    with pytest.raises(RequestError) as excinfo:
        parse_json_body(raw)
    assert excinfo.value.status == 400
    assert excinfo.value.param == param
    assert words in excinfo.value.message


@pytest.mark.parametrize("body", [
    {"max_tokens": 2**64 - 1, "seed": -(2**63)},
    {"tools": [{"deep": nested(MAX_JSON_DEPTH - 3)}]},
    {"messages": [{"content": "héllo 東京 🎉 \U0001F600"}]},  # a surrogate *pair* in JSON is fine
    {"prompt": list(range(100_000))},
])
def test_what_it_can_carry_passes(body: dict) -> None:
    assert parse_json_body(json.dumps(body).encode()) == body


def test_escaped_surrogate_pairs_are_valid_unicode() -> None:
    assert parse_json_body(b'{"a": "\\ud83d\\ude00"}') == {"a": "\U0001F600"}
