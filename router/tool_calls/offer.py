"""The tools a request offers, typed: each dialect reads its own JSON (`tools` as OpenAI
chat, Anthropic or Responses spell them) into `OfferedTool`s and a choice, naming its own
fields in every error, and `offer_tools` turns them into what the worker renders and what
the answer's parser and grammar need. The checks that do not depend on a dialect's
spelling (unique names, a named function that is offered, a forced call the grammar can
enforce) live here once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from protocol.constraints import constraint_problem
from protocol.messages import Constraint
from protocol.tool_dialects import MLXD
from router.tool_calls.grammar import forced_call_grammar
from router.tool_calls.request import AUTO, NONE, ToolRequest, ToolSpec
from router.validation import bad


@dataclass(frozen=True)
class OfferedTool:
    """One function the client offers: its name, description and arguments' JSON schema."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None

    def rendered(self) -> dict[str, Any]:
        """What chat templates read, in one key order (same tools, same prompt)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        if self.parameters is not None:
            function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolChoice:
    """How the answer may use the tools: NONE, AUTO, REQUIRED or FUNCTION (naming
    `function`), and whether more than one call counts. `spelled` is the client's own
    value, quoted back in errors."""

    choice: str = AUTO
    function: str | None = None
    parallel: bool = True
    spelled: str = "auto"


def offer_tools(tools: Sequence[OfferedTool], choice: ToolChoice, *, name_field: str = "tools[{}].name",
                choice_field: str = "tool_choice") -> tuple[list[dict[str, Any]] | None, ToolRequest | None]:
    """(the tools as the worker renders them, what the parser and grammar need); (None,
    None) when there are no tools or the choice is "none": then they are neither rendered
    nor parsed. `name_field` is where the dialect spells the i-th tool's name."""
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if tool.name in seen:
            raise bad("tools", f"'{name_field.format(i)}' {tool.name!r} is offered twice")
        seen.add(tool.name)
    if choice.choice not in (NONE, AUTO) and not tools:
        raise bad(choice_field, f"'{choice_field}' {choice.spelled} needs 'tools'")
    if not tools or choice.choice == NONE:
        return None, None
    if choice.function is not None and choice.function not in seen:
        raise bad(choice_field, f"'{choice_field}' names the function {choice.function!r}, which 'tools' does "
                  "not hold")
    specs = tuple(ToolSpec(tool.name, tool.parameters) for tool in tools)
    request = ToolRequest(specs, choice.choice, choice.function, choice.parallel)
    if request.forces_call:  # refused here, before a model is loaded for it; the dialect changes no schema
        problem = constraint_problem(Constraint(kind="lark", source=forced_call_grammar(MLXD, request)))
        if problem is not None:
            raise bad("tools", f"'{choice_field}' {choice.spelled} cannot be enforced on these tools' "
                      f"parameters: {problem.splitlines()[0]}")
    return [tool.rendered() for tool in tools], request
