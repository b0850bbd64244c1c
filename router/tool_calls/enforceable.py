"""A tool's parameters schema as the grammar engine can hold a call to it.

Real clients' schemas use JSON Schema keywords llguidance does not implement (Claude
Code's `AskUserQuestion` has `propertyNames`); refusing the whole call grammar for one
keyword would leave every call of every tool free. Instead the keywords it names are
dropped where they appear as keywords (never a property that happens to share the name),
which only loosens the schema, and a schema that still cannot be compiled allows any
object; either way the call's name and every other tool stay held. Each relaxation is
logged once per schema.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from typing import Any

from protocol.constraints import constraint_problem
from protocol.output_constraint import Constraint

log = logging.getLogger(__name__)

ANY_OBJECT: dict[str, Any] = {"type": "object"}
_UNIMPLEMENTED = re.compile(r'Unimplemented keys: \[([^\]]*)\]')
_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")  # name -> schema


def enforceable(parameters: dict[str, Any] | None) -> dict[str, Any]:
    """`parameters` (None: any object), loosened as the module docstring says."""
    if not parameters:
        return ANY_OBJECT
    return json.loads(_enforceable(json.dumps(parameters)))  # key order kept: the grammar holds properties to it


@functools.lru_cache(maxsize=256)
def _enforceable(text: str) -> str:
    schema = json.loads(text)
    dropped: set[str] = set()
    while (problem := constraint_problem(Constraint("json_schema", json.dumps(schema)))) is not None:
        found = _UNIMPLEMENTED.search(problem)
        keys = {k.strip().strip('"') for k in found.group(1).split(",")} - dropped if found else set()
        if not keys:
            log.warning("a tool's parameters cannot be enforced (%s): its calls' arguments are held to any object",
                        problem.splitlines()[0])
            return json.dumps(ANY_OBJECT)
        dropped |= keys
        schema = _without(schema, keys)
    if dropped:
        log.info("a tool's parameters are held without the keywords %s, which the grammar engine lacks",
                 sorted(dropped))
    return json.dumps(schema)


def _without(node: Any, keys: set[str]) -> Any:
    """`node` with the schema keywords `keys` removed at every schema level."""
    if isinstance(node, list):
        return [_without(item, keys) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in keys:
            continue
        if key in _MAPS and isinstance(value, dict):
            out[key] = {name: _without(sub, keys) for name, sub in value.items()}
        else:
            out[key] = _without(value, keys)
    return out
