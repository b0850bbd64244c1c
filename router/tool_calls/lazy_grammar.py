"""The lazy call grammar of `tool_choice: "auto"`: the answer is free until the model
writes its dialect's call opener, and from there the call is held to the request's tools
(a known name, arguments valid against that tool's schema, the call closed), as
llama.cpp's lazy grammars do. The worker watches for the triggers and switches the
grammar on (worker/lazy_grammar.py); this module says, per dialect, what the triggers
are and what a call after them looks like.

The call object is spelled with literals around each tool's `%json` arguments, in the
layout of every constrained answer (`JSON_OPTIONS`), so that the grammar can begin in the
middle of the object (`{"name"` written bare at the answer's start is a trigger too:
Qwen2.5-Coder-0.5B writes its calls that way).
"""

from __future__ import annotations

import json
from protocol.constraints import lark_json
from protocol.messages import Constraint
from protocol.tool_dialects import CALL_CLOSE, CALL_OPEN, HERMES, LLAMA3_JSON, MISTRAL, MLXD
from router.tool_calls.enforceable import enforceable
from router.tool_calls.request import ToolRequest

BARE_CALL = '{"name"'  # a call object written bare where the answer starts
FENCED_CALLS = ('```json\n{"name"', '```\n{"name"')  # or in a Markdown code block
PYTHON_TAG = "<|python_tag|>"  # Llama's call marker
MISTRAL_CALLS = "[TOOL_CALLS]"  # Mistral's
# Space the model may put around the call object's own punctuation: small models write
# their calls pretty-printed (`{\n  "name": ...`). Bounded, so no answer fills up with it;
# inside the arguments the layout is JSON_OPTIONS', as in every constrained answer.
SPACE = "SPACE"
SPACE_RULE = f"{SPACE}: /[ \\t\\r\\n]{{1,12}}/"


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _call_rule(request: ToolRequest, arguments_key: str) -> str:
    """`call: ...`, one call object of any offered tool, and one `argsN` rule per tool."""
    gap = f"{SPACE}?"
    heads, rules = [], []
    for i, tool in enumerate(request.tools):
        heads.append(f"{_literal(json.dumps(tool.name, ensure_ascii=False))} {gap} \",\" {gap} "
                     f"{_literal(json.dumps(arguments_key))} {gap} \":\" {gap} args{i}")
        rules.append(f"args{i}: {lark_json(enforceable(tool.parameters))}")
    call = f'call: "{{" {gap} {_literal(json.dumps("name"))} {gap} ":" {gap} ({" | ".join(heads)}) {gap} "}}"'
    return "\n".join([call, *rules, SPACE_RULE])


def lazy_call_constraint(dialect: str, request: ToolRequest) -> Constraint:
    """The lazy constraint of an `auto` answer in `dialect`. Several calls may follow one
    another only where `request.parallel` allows; otherwise the answer ends after its
    first call."""
    if dialect in (HERMES, MLXD):  # one tagged block per call; more calls are new triggers
        start = (f"start: {_literal(CALL_OPEN)} {SPACE}? call {SPACE}? {_literal(CALL_CLOSE)}"
                 f' | call | "```" "json"? {SPACE}? call {SPACE}? "```"')
        return Constraint("lark", f"{start}\n{_call_rule(request, 'arguments')}\n", triggers=[CALL_OPEN],
                          start_triggers=_start_triggers(request, BARE_CALL, *FENCED_CALLS), rearm=request.parallel)
    if dialect == LLAMA3_JSON:  # the calls are the whole answer: `;` between them
        more = f' ({SPACE}? ";" {SPACE}? call)*' if request.parallel else ""
        return Constraint("lark", f"start: call{more}\n{_call_rule(request, 'parameters')}\n", markers=[PYTHON_TAG],
                          start_triggers=_start_triggers(request, BARE_CALL))
    if dialect == MISTRAL:  # an array of calls after [TOOL_CALLS] (or bare, where the detokenizer drops it)
        more = f' ({SPACE}? "," {SPACE}? call)*' if request.parallel else ""
        return Constraint("lark", f'start: "[" {SPACE}? call{more} {SPACE}? "]"\n{_call_rule(request, "arguments")}\n',
                          markers=[MISTRAL_CALLS], start_triggers=_start_triggers(request, "[" + BARE_CALL))
    raise ValueError(f"no lazy grammar for tool dialect {dialect!r}")


def _start_triggers(request: ToolRequest, *triggers: str) -> list[str]:
    """The call forms only read where the answer starts: held only where they count as
    calls at all, i.e. unless calls written as text are switched off (`tool_text_recovery`)."""
    return list(triggers) if request.text_recovery else []
