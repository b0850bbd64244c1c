"""What a request asks of a reasoning model: how many tokens it may think
(`AddRequest.reasoning_budget`), read from each API's own field.

- Anthropic `thinking`: `{"type": "enabled", "budget_tokens": N}` -> N (Anthropic asks for
  N >= 1024 and below `max_tokens`; mlxd takes any N >= 0, and the thinking counts toward
  `max_tokens` as at Anthropic); `{"type": "disabled"}` -> 0 (the span closes at once);
  `{"type": "adaptive"}` and no field -> no budget.
- OpenAI chat `reasoning_effort` and Responses `reasoning.effort`: `EFFORT_BUDGETS`; the
  reasoning counts toward `max_tokens` / `max_output_tokens`, as OpenAI's reasoning tokens
  count toward `max_completion_tokens`.
A profile's `reasoning_budget` fills in when the request names none. A model that does not
reason ignores it all.
"""

from __future__ import annotations

from typing import Any

from router.validation import bad, is_int

EFFORT_BUDGETS = {"none": 0, "minimal": 0, "low": 1024, "medium": 4096, "high": 16384}


def anthropic_budget(body: dict[str, Any]) -> int | None:
    thinking = body.get("thinking")
    if thinking is None:
        return None
    if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "disabled", "adaptive"):
        raise bad("thinking", "'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": N}, "
                  "{\"type\": \"disabled\"} or {\"type\": \"adaptive\"}")
    if thinking["type"] == "disabled":
        return 0
    if thinking["type"] == "adaptive":
        return None
    budget = thinking.get("budget_tokens")
    if not is_int(budget) or budget < 0:
        raise bad("thinking", f"'thinking.budget_tokens' must be an integer >= 0, got {budget!r}")
    return budget


def effort_budget(effort: Any, param: str) -> int | None:
    """The budget of an OpenAI reasoning effort (None: not given)."""
    if effort is None:
        return None
    if effort not in EFFORT_BUDGETS:
        raise bad(param, f"'{param}' must be one of {', '.join(EFFORT_BUDGETS)}, got {effort!r}")
    return EFFORT_BUDGETS[effort]


def responses_budget(body: dict[str, Any]) -> int | None:
    reasoning = body.get("reasoning")
    if reasoning is None:
        return None
    if not isinstance(reasoning, dict):
        raise bad("reasoning", "'reasoning' must be an object such as {\"effort\": \"low\"}")
    return effort_budget(reasoning.get("effort"), "reasoning.effort")
