"""A request's tools and tool choice, in no API's shape: what the parser and the grammar
need, built by each API from its own body fields."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NONE = "none"  # tools neither rendered nor parsed: such a request has no ToolRequest
AUTO = "auto"  # the model decides
REQUIRED = "required"  # at least one call, any offered function
FUNCTION = "function"  # one call, of the named function


@dataclass(frozen=True)
class ToolSpec:
    """One offered function: its name and its arguments' JSON schema (None: any object)."""

    name: str
    parameters: dict[str, Any] | None = None


@dataclass(frozen=True)
class ToolRequest:
    """The offered tools and how the answer may use them. `choice` is AUTO, REQUIRED or
    FUNCTION (with `function` naming it); a request whose choice is "none" has no
    ToolRequest at all, since its tools are neither rendered nor parsed."""

    tools: tuple[ToolSpec, ...]
    choice: str = AUTO
    function: str | None = None
    parallel: bool = True  # False: only the first call counts
    text_recovery: bool = True  # calls written as text count (`tool_text_recovery`, per model or profile)
    call_grammar: bool = True  # "auto": a call, once begun, is held to the tools (`tool_call_grammar`)
    names: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", frozenset(tool.name for tool in self.tools))

    @property
    def forces_call(self) -> bool:
        """Whether the answer must be a call, which only a grammar can guarantee."""
        return self.choice != AUTO

    @property
    def max_calls(self) -> int | None:
        return None if self.parallel else 1
