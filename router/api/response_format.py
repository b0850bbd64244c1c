"""OpenAI's `response_format` -> the worker's output `Constraint`.

`{"type": "text"}` (or none): free text. `{"type": "json_object"}`: any JSON object.
`{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`: JSON matching the
schema, as the openai SDK's `parse()` sends it ($defs/$ref, anyOf with null, enum,
additionalProperties false...). The schema is checked here, with the grammar engine the
worker uses: a feature it cannot enforce is a 400 naming it, never ignored.
"""

from __future__ import annotations

import json
from typing import Any

from protocol.constraints import constraint_problem
from protocol.messages import Constraint
from router.validation import bad, short

PARAM = "response_format"
TYPES = ("text", "json_object", "json_schema")


def parse_response_format(body: dict[str, Any]) -> Constraint | None:
    """The constraint `response_format` asks for, or None for free text."""
    value = body.get(PARAM)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad(PARAM, "'response_format' must be an object, e.g. {\"type\": \"json_object\"}")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        constraint = Constraint("json_object")
    elif kind == "json_schema":
        constraint = _json_schema(value.get("json_schema"))
    else:
        raise bad(PARAM, f"'response_format.type' must be one of {', '.join(TYPES)}, got {short(kind)}")
    problem = constraint_problem(constraint)
    if problem is not None:
        where = "response_format.json_schema.schema" if kind == "json_schema" else PARAM
        raise bad(PARAM, f"'{where}' cannot be enforced: {problem}")
    return constraint


def _json_schema(spec: Any) -> Constraint:
    if not isinstance(spec, dict):
        raise bad(PARAM, "'response_format.json_schema' must be an object with 'name' and 'schema'")
    name = spec.get("name")
    if name is not None and not isinstance(name, str):
        raise bad(PARAM, f"'response_format.json_schema.name' must be a string, got {short(name)}")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise bad(PARAM, f"'response_format.json_schema.strict' must be true or false, got {short(strict)}")
    schema = spec.get("schema")
    if schema is None:  # OpenAI allows it: then any JSON object
        return Constraint("json_object")
    if not isinstance(schema, dict):
        raise bad(PARAM, f"'response_format.json_schema.schema' must be a JSON Schema object, got {short(schema)}")
    return Constraint("json_schema", json.dumps(schema))
