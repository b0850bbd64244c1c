"""Repeated calls: an answer's call identical to one whose result the request just
brought back. Small models do it (Qwen2.5-Coder-0.5B called `get_weather` for Paris again,
twice, after its result); mlxd reports it to the client and the log, and changes nothing.

Read from the internal chat messages every API's request becomes, so the rule is written
once: the last results are the `tool` messages after the conversation's last assistant
turn (Anthropic's user turn that carries them may end with text, a user message of its
own here), and each points by `tool_call_id` at a call of an earlier assistant turn.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from router.tool_calls.base import RawCall

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AnsweredCall:
    """A call of the history whose result is among the request's last messages."""

    id: str  # as the client spelled it
    name: str
    arguments: Any  # parsed JSON (a client may reorder keys or respace)


def last_results(messages: Sequence[dict[str, Any]] | None) -> list[AnsweredCall]:
    """The calls whose results follow the last assistant turn, in the results' order."""
    if not messages:
        return []
    calls: dict[str, tuple[str, Any]] = {}
    results: list[str] = []
    for message in messages:
        if message.get("role") == "assistant":
            results = []
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                calls[call.get("id") or ""] = (function.get("name"), _parsed(function.get("arguments")))
        elif message.get("role") == "tool" and isinstance(message.get("tool_call_id"), str):
            results.append(message["tool_call_id"])
    return [AnsweredCall(call_id, *calls[call_id]) for call_id in results if call_id and call_id in calls]


def repeated_calls(calls: Sequence[RawCall], answered: Sequence[AnsweredCall], label: str) -> list[dict[str, Any]]:
    """The answer's calls equal (name and arguments as JSON values) to a just-answered one,
    each `{"index", "name", "of_call_id"}` for the response's `mlxd.tool_calls.repeated`;
    each logged."""
    repeated = []
    for index, (name, arguments) in enumerate(calls):
        earlier = next((a for a in answered if a.name == name and a.arguments == arguments), None)
        if earlier is not None:
            logger.info("%s: call %d repeats %r of %s, whose result is the request's last message", label, index,
                        name, earlier.id)
            repeated.append({"index": index, "name": name, "of_call_id": earlier.id})
    return repeated


def _parsed(arguments: Any) -> Any:
    """A history call's arguments as a JSON value (clients send a JSON object's text)."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments
