"""protocol/constraints.py: which constraints the grammar engine can enforce, checked
without a tokenizer (the router's check before forwarding)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from protocol.constraints import constraint_problem, grammar_for, lark_json
from protocol.messages import Constraint

# A schema as the openai SDK's parse() sends it for a Pydantic model: title, $defs/$ref,
# enum, anyOf with null, additionalProperties false, required.
PYDANTIC_SCHEMA: dict[str, Any] = {
    "$defs": {"Species": {"enum": ["cat", "dog"], "title": "Species", "type": "string"}},
    "properties": {
        "name": {"title": "Name", "type": "string"},
        "species": {"$ref": "#/$defs/Species"},
        "owner": {"anyOf": [{"type": "string"}, {"type": "null"}], "title": "Owner"},
        "tags": {"items": {"type": "string"}, "title": "Tags", "type": "array"},
    },
    "required": ["name", "species", "owner", "tags"],
    "title": "Pet", "type": "object", "additionalProperties": False,
}
TOOL_CALL_LARK = r'''start: "<tool_call>\n" call "\n</tool_call>"
call: %json{"type": "object", "properties": {"name": {"const": "get_weather"},
      "arguments": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
      "required": ["name", "arguments"]}
'''


def schema(value: Any) -> Constraint:
    return Constraint("json_schema", json.dumps(value))


@pytest.mark.parametrize("constraint", [
    Constraint("json_object"),
    schema(PYDANTIC_SCHEMA),
    schema({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}}),
    schema({"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}, "minItems": 1, "maxItems": 3}),
    schema({"oneOf": [{"type": "string"}, {"type": "integer"}]}),
    Constraint("lark", TOOL_CALL_LARK),
    Constraint("lark", 'start: "<tool_call>\\n" ' + lark_json(PYDANTIC_SCHEMA) + ' "\\n</tool_call>"'),
], ids=lambda c: c.kind + ":" + c.source[:30])
def test_enforceable_constraints_have_no_problem(constraint: Constraint) -> None:
    assert constraint_problem(constraint) is None
    assert grammar_for(constraint)


@pytest.mark.parametrize("constraint, named", [
    (schema({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}), "uniqueItems"),
    (schema({"type": "object", "not": {"required": ["a"]}}), "not"),
    (schema({"if": {"type": "string"}, "then": {"minLength": 1}}), "if"),
    (schema({"type": "object", "dependentRequired": {"a": ["b"]}}), "dependentRequired"),
    (schema({"type": "string", "format": "no-such-format"}), "no-such-format"),
    (schema({"$ref": "#/$defs/Missing"}), "Missing"),
    (schema([1, 2]), "JSON object"),
    (Constraint("json_schema", "{not json"), "not valid JSON"),
    (Constraint("lark", "start: undefined_rule"), "undefined_rule"),
    (Constraint("regex", "a+"), "unknown constraint kind"),
])
def test_unenforceable_constraints_name_the_problem(constraint: Constraint, named: str) -> None:
    problem = constraint_problem(constraint)
    assert problem is not None and named in problem
