"""bench/agent_session.py's session: the same for a seed, sized as the issue asks, and a
conversation that only grows (each turn's messages start with the previous turn's)."""

from __future__ import annotations

import json
import re

import pytest

from bench._agent_transcript import (
    NUM_TURNS,
    SIZE_TOLERANCE,
    SYSTEM_TOKENS,
    TOOL_RESULT_TOKENS,
    build_session,
    messages_for_turn,
)


def count_tokens(text: str) -> int:
    """A stand-in for a tokenizer (no model here): words and punctuation marks."""
    return len(re.findall(r"\w+|[^\w\s]", text))


def test_same_seed_same_session_other_seed_other_session() -> None:
    first, again, other = build_session(3, count_tokens), build_session(3, count_tokens), build_session(4, count_tokens)
    assert first == again
    assert other.system != first.system
    assert [t.result for t in other.tool_turns] != [t.result for t in first.tool_turns]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sizes_and_turns_as_specified(seed: int) -> None:
    script = build_session(seed, count_tokens)
    assert script.num_turns == NUM_TURNS == 20
    assert abs(count_tokens(script.system) - SYSTEM_TOKENS) <= SYSTEM_TOKENS * SIZE_TOLERANCE
    sizes = [count_tokens(t.result) for t in script.tool_turns]
    assert all(abs(n - TOOL_RESULT_TOKENS) <= TOOL_RESULT_TOKENS * SIZE_TOLERANCE for n in sizes), sizes
    assert len({t.result for t in script.tool_turns}) == len(script.tool_turns)  # every result differs
    assert len({t.call_id for t in script.tool_turns}) == len(script.tool_turns)
    assert {t.name for t in script.tool_turns} >= {"Read", "Bash", "Grep"}


def test_other_sizes_follow_the_arguments() -> None:
    script = build_session(0, count_tokens, num_turns=5, system_tokens=600, tool_result_tokens=400)
    assert script.num_turns == 5
    assert abs(count_tokens(script.system) - 600) <= 600 * SIZE_TOLERANCE
    assert all(abs(count_tokens(t.result) - 400) <= 400 * SIZE_TOLERANCE for t in script.tool_turns)


def test_each_turn_extends_the_previous_one() -> None:
    script = build_session(0, count_tokens)
    replies = [f"Reply {n}: looking at the next file." for n in range(1, script.num_turns)]
    previous = messages_for_turn(script, 1, [])
    assert [m["role"] for m in previous] == ["system", "user"]
    for turn in range(2, script.num_turns + 1):
        messages = messages_for_turn(script, turn, replies)
        assert messages[: len(previous)] == previous
        assistant, tool = messages[len(previous):]
        call = assistant["tool_calls"][0]
        assert assistant["content"] == replies[turn - 2]
        assert tool == {"role": "tool", "tool_call_id": call["id"], "content": script.tool_turns[turn - 2].result}
        assert json.loads(call["function"]["arguments"]) == script.tool_turns[turn - 2].arguments
        previous = messages
    with pytest.raises(ValueError):
        messages_for_turn(script, 3, replies[:1])
