"""Which offered tools' parameter schemas a call's arguments satisfy: the check that lets
a call written as text become a call (`router.tool_calls.written_calls`).

Validated with `jsonschema` (the reference implementation, Draft 2020-12 unless a schema
names its own draft). A schema that is not valid JSON Schema, or that needs a `$ref` the
request does not hold, accepts nothing: a call is never recovered on a guess.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import jsonschema
import jsonschema.exceptions
import referencing.exceptions

from router.tool_calls.request import ToolSpec

logger = logging.getLogger(__name__)


class ToolSchemas:
    """The offered tools' validators, each compiled on first use (most answers hold no
    call written as text, and then none is compiled)."""

    def __init__(self, tools: Sequence[ToolSpec]) -> None:
        self._tools = {tool.name: tool.parameters for tool in tools}
        self._validators: dict[str, Any] = {}

    def accepts(self, name: str, arguments: dict[str, Any]) -> bool:
        """Whether `name` is offered and its schema accepts `arguments` (no schema: any
        object, as the tool's request said)."""
        if name not in self._tools:
            return False
        schema = self._tools[name]
        if schema is None:
            return True
        validator = self._validator(name, schema)
        if validator is None:
            return False
        try:
            return bool(validator.is_valid(arguments))
        except (jsonschema.exceptions.SchemaError, referencing.exceptions.Unresolvable):
            return False

    def matching(self, arguments: dict[str, Any]) -> list[str]:
        """The offered tools whose schemas accept `arguments`, in the request's order."""
        return [name for name in self._tools if self.accepts(name, arguments)]

    def _validator(self, name: str, schema: dict[str, Any]) -> Any:
        if name not in self._validators:
            cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
            try:
                cls.check_schema(schema)
                self._validators[name] = cls(schema)
            except jsonschema.exceptions.SchemaError as exc:
                logger.info("tool %r: its parameters are no valid JSON schema (%s); no call to it is read "
                            "from text", name, exc.message)
                self._validators[name] = None
        return self._validators[name]
