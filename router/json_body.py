"""A request body as JSON that every later stage can carry, or a 400 saying why not.

Whatever the router accepts is later packed by msgpack for the worker and rendered by a
Jinja chat template there. Both have limits that JSON does not: msgpack refuses
integers outside [-2**63, 2**64) and strings that are not valid Unicode (a lone
`\\ud800` escape), and recursion in either gives out long before JSON's nesting does.
Checking the whole body once here turns each of those into a clear 400 instead of a
failure deep inside another process.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from protocol.codec import WIRE_INT_MAX, WIRE_INT_MIN
from protocol.errors import RequestError

# Real clients' deepest bodies are JSON schemas in tool definitions: ~10 levels. msgpack's
# packer gives up at 512 and the template renderer recurses per level.
MAX_JSON_DEPTH = 64

_SURROGATE = re.compile("[\ud800-\udfff]")


def _bad(param: str | None, message: str) -> RequestError:
    return RequestError(message, status=400, param=param)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses as inf
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def parse_json_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object that the wire and the worker can carry."""
    try:
        body = json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise _bad(None, f"the request body is nested too deeply (at most {MAX_JSON_DEPTH} levels)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise _bad(None, f"could not parse the request body as JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _bad(None, f"the request body must be a JSON object, got {type(body).__name__}")
    check_carriable(body)
    return body


def _has_surrogate(text: str) -> bool:
    return not text.isascii() and _SURROGATE.search(text) is not None


def check_carriable(body: dict[str, Any]) -> None:
    """Raise a 400 naming the top-level field that holds a value the wire cannot carry:
    nesting deeper than MAX_JSON_DEPTH, an integer outside msgpack's range, or a string
    (value or key) with a lone surrogate. Iterative, so no body can exhaust the stack."""
    stack: list[tuple[Any, int, str | None]] = []
    for key, value in body.items():
        if _has_surrogate(key):
            raise _bad(None, "a field name holds a lone UTF-16 surrogate; send valid Unicode")
        stack.append((value, 1, key))
    while stack:
        value, depth, field = stack.pop()
        if isinstance(value, str):
            if _has_surrogate(value):
                raise _bad(field, f"'{field}' holds a string with a lone UTF-16 surrogate (an unpaired "
                           "\\ud800-\\udfff escape); send valid Unicode")
        elif isinstance(value, bool) or value is None or isinstance(value, float):
            continue
        elif isinstance(value, int):
            if not WIRE_INT_MIN <= value <= WIRE_INT_MAX:
                raise _bad(field, f"'{field}' holds an integer out of range (at most 64 bits)")
        elif depth >= MAX_JSON_DEPTH:
            raise _bad(field, f"'{field}' is nested too deeply (at most {MAX_JSON_DEPTH} levels)")
        elif isinstance(value, dict):
            for key, item in value.items():
                if _has_surrogate(key):
                    raise _bad(field, f"'{field}' holds a key with a lone UTF-16 surrogate; send valid Unicode")
                stack.append((item, depth + 1, field))
        elif isinstance(value, list):
            if all(type(item) is int for item in value):  # token ids: check the range at C speed
                if value and not (WIRE_INT_MIN <= min(value) and max(value) <= WIRE_INT_MAX):
                    raise _bad(field, f"'{field}' holds an integer out of range (at most 64 bits)")
                continue
            stack.extend((item, depth + 1, field) for item in value)
