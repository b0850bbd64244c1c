"""router/api/response_format.py: OpenAI's response_format -> the worker's Constraint, and
the 400 (param "response_format") for what the grammar engine cannot enforce."""

from __future__ import annotations

import json
from typing import Any

import pytest

from protocol.errors import RequestError
from protocol.messages import Constraint
from router.api.openai_chat import parse as parse_chat
from router.api.openai_completions import parse as parse_completion
from router.api.response_format import parse_response_format
from tests.protocol.test_constraints import PYDANTIC_SCHEMA

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def json_schema(schema: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "Pet", "schema": schema, "strict": True, **extra}}


@pytest.mark.parametrize("value, expected", [
    (None, None),
    ({"type": "text"}, None),
    ({"type": "json_object"}, Constraint("json_object")),
    (json_schema(PYDANTIC_SCHEMA), Constraint("json_schema", json.dumps(PYDANTIC_SCHEMA))),
    ({"type": "json_schema", "json_schema": {"name": "any"}}, Constraint("json_object")),
])
def test_response_format_maps_to_a_constraint(value: Any, expected: Constraint | None) -> None:
    assert parse_response_format({"response_format": value}) == expected


@pytest.mark.parametrize("value, named", [
    ("json", "must be an object"),
    ({"type": "xml"}, "'response_format.type' must be one of"),
    ({"type": "json_schema"}, "'response_format.json_schema' must be an object"),
    (json_schema([1]), "must be a JSON Schema object"),
    (json_schema({"type": "object"}, strict="yes"), "strict"),
    ({"type": "json_schema", "json_schema": {"name": 3, "schema": {}}}, "name"),
    (json_schema({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}), "uniqueItems"),
    (json_schema({"type": "object", "properties": {"a": {"not": {"type": "null"}}}}), '"not"'),
])
def test_what_cannot_be_enforced_is_a_400_naming_it(value: Any, named: str) -> None:
    with pytest.raises(RequestError) as err:
        parse_response_format({"response_format": value})
    assert (err.value.status, err.value.param) == (400, "response_format")
    assert named in err.value.message


def test_chat_and_completions_carry_the_constraint_to_the_worker() -> None:
    chat = parse_chat({**CHAT, "response_format": json_schema(PYDANTIC_SCHEMA)})
    assert chat.add.constraint == Constraint("json_schema", json.dumps(PYDANTIC_SCHEMA))
    text = parse_completion({"model": "m", "prompt": "x", "response_format": {"type": "json_object"}})
    assert text.add.constraint == Constraint("json_object")
    assert parse_chat(CHAT).add.constraint is None
