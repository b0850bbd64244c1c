"""The grammar that forces a tool call (`tool_choice` "required" or a named function), in
llguidance's Lark dialect, for the model's own call markup: the worker's grammar engine
masks every token that would leave it, so even a small model answers with a call whose
arguments match the function's schema.

The JSON inside is held to the layout of every constrained answer
(`protocol.constraints.JSON_OPTIONS`: `json.dumps`'s, which models see in their templates).
Hermes models have their tags as tokens of their own, which the grammar names as tokens
(llguidance will not spell a token's text with other tokens); mlxd's fallback spells them.
"""

from __future__ import annotations

import json
from typing import Any

from protocol.constraints import JSON_OPTIONS
from protocol.tool_dialects import CALL_CLOSE, CALL_OPEN, HERMES, LLAMA3_JSON, MISTRAL, MLXD
from router.tool_calls.request import FUNCTION, REQUIRED, ToolRequest

_DEFINITIONS = ("$defs", "definitions")


def _call_schema(name: str, parameters: dict[str, Any] | None, arguments_key: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, arguments_key: parameters or {"type": "object"}},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


def _hoist_definitions(parameters: dict[str, Any] | None, prefix: str, definitions: dict[str, Any]
                       ) -> dict[str, Any] | None:
    """`parameters` without its `$defs`, which move into `definitions` under `prefix`:
    inside the call schema the parameters are no longer the root that their `#/$defs/...`
    references resolve from (pydantic's schemas, as LangChain and the SDK send, use them)."""
    if not parameters or not any(isinstance(parameters.get(key), dict) for key in _DEFINITIONS):
        return parameters

    def rewrite(node: Any) -> Any:
        if isinstance(node, list):
            return [rewrite(item) for item in node]
        if not isinstance(node, dict):
            return node
        out = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                for container in _DEFINITIONS:
                    if value.startswith(f"#/{container}/"):
                        value = f"#/$defs/{prefix}{value[len(container) + 3:]}"
                out[key] = value
            else:
                out[key] = rewrite(value)
        return out

    for container in _DEFINITIONS:
        for name, definition in (parameters.get(container) or {}).items():
            definitions[prefix + name] = rewrite(definition)
    return rewrite({key: value for key, value in parameters.items() if key not in _DEFINITIONS})


def _json(schema: dict[str, Any], definitions: dict[str, Any]) -> str:
    top = {"x-guidance": JSON_OPTIONS, **schema, **({"$defs": definitions} if definitions else {})}
    return "%json " + json.dumps(top, ensure_ascii=False)


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def forced_call_grammar(dialect: str, request: ToolRequest) -> str:
    """The Lark grammar of an answer that is one call: of the named function, or for
    "required" of any offered function. One, not several, even where parallel calls are
    allowed: a small model that is let write another call after each one keeps calling
    until its tokens run out (SmolLM2 does), and its last call is then cut short."""
    if request.choice not in (REQUIRED, FUNCTION):
        raise ValueError(f"tool choice {request.choice!r} forces no call")
    tools = [t for t in request.tools if request.choice != FUNCTION or t.name == request.function]
    arguments_key = "parameters" if dialect == LLAMA3_JSON else "arguments"
    definitions: dict[str, Any] = {}
    schemas = [_call_schema(t.name, _hoist_definitions(t.parameters, f"tool{i}_", definitions), arguments_key)
               for i, t in enumerate(tools)]
    one_call = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    if dialect == MISTRAL:  # the array [TOOL_CALLS] introduces, which the parser reads bare
        array = {"type": "array", "items": one_call, "minItems": 1, "maxItems": 1}
        return f"start: calls\ncalls: {_json(array, definitions)}\n"
    if dialect == LLAMA3_JSON:
        return f"start: call\ncall: {_json(one_call, definitions)}\n"
    if dialect == HERMES:  # the tags are tokens of their own in these vocabularies (Qwen's, Hermes'):
        open_tag, close_tag = CALL_OPEN, CALL_CLOSE  # written <tool_call>, Lark names that token
    elif dialect == MLXD:  # any vocabulary: the tags as text
        open_tag, close_tag = _literal(CALL_OPEN), _literal(CALL_CLOSE)
    else:
        raise ValueError(f"no grammar for tool dialect {dialect!r}")
    # the newline a model may write after the closing tag is allowed before it stops
    newline = _literal(chr(10))
    return (f"start: block {newline}?\n"
            f"block: {open_tag} {newline} call {newline} {close_tag}\n"
            f"call: {_json(one_call, definitions)}\n")
