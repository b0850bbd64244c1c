"""What a `Constraint` means as a grammar, in llguidance's terms.

The router checks a constraint with it before forwarding (an unsupported schema feature
is the client's 400, named) and the worker compiles the very same grammar against its
vocabulary; both must agree, so the translation lives here. No tokenizer is needed.
"""

from __future__ import annotations

import json
from typing import Any

import llguidance

from protocol.messages import Constraint

CONSTRAINT_KINDS = ("json_object", "json_schema", "lark")

# How constrained JSON is laid out. One fixed layout (", " and ": ", no other
# whitespace) rather than free whitespace: a small model offered "any whitespace" can
# emit newlines forever inside a valid document; this layout is the one models see
# most (Python's json.dumps) and the one the OpenAI SDK parses like any other.
JSON_OPTIONS: llguidance.JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}

ANY_JSON_OBJECT = '{"type": "object"}'


def lark_json(schema: dict[str, Any]) -> str:
    """`%json{...}` for a Lark grammar (e.g. a forced tool call's arguments): `schema`
    laid out as JSON_OPTIONS, like response_format's JSON. Without them llguidance's
    %json allows free whitespace, and a small model may fill its budget with spaces."""
    return "%json" + json.dumps({**schema, "x-guidance": {**JSON_OPTIONS, **schema.get("x-guidance", {})}})


def grammar_for(constraint: Constraint) -> str:
    """The constraint as an llguidance grammar (its JSON form); raises ValueError if the
    source is not even the right kind of text (a schema that is not a JSON object)."""
    if constraint.kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema(ANY_JSON_OBJECT, defaults=JSON_OPTIONS)
    if constraint.kind == "json_schema":
        try:
            schema = json.loads(constraint.source)
        except ValueError as exc:
            raise ValueError(f"the schema is not valid JSON: {exc}") from None
        if not isinstance(schema, dict):
            raise ValueError("the schema must be a JSON object")
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    if constraint.kind == "lark":
        return llguidance.LLMatcher.grammar_from_lark(constraint.source)
    raise ValueError(f"unknown constraint kind {constraint.kind!r}; expected one of {', '.join(CONSTRAINT_KINDS)}")


def constraint_problem(constraint: Constraint) -> str | None:
    """Why the grammar engine cannot enforce `constraint` (e.g. 'Unimplemented keys:
    ["uniqueItems"]'), or None when it can. Unsupported features are errors, never
    skipped: an answer must not look constrained by a schema it silently ignored."""
    try:
        grammar = grammar_for(constraint)
    except ValueError as exc:
        return str(exc)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    return ("; ".join(messages) or "invalid grammar") if is_error else None
