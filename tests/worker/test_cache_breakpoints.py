"""worker.cache_breakpoints: a breakpoint (a point of the request) becomes a token position
of the real prompt, on the real Qwen2.5-Coder and SmolLM2 tokenizers and templates: a true
prefix, ending at the marked block (plus the template's markup after it, never the next
message's text), the same in every request that shares that prefix; and the cache
creation figures it implies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mlx_lm.utils import load_tokenizer

from protocol.cache_breakpoints import TTL_1H_S, TTL_5M_S, CacheBreakpoint
from worker.cache_breakpoints import (
    BreakpointPosition,
    CacheCreation,
    breakpoint_positions,
    cache_creation,
    cut_request,
)
from worker.prompts import render_chat

PART1 = "You are a coding agent. Follow the house rules of the repository you work in."
PART2 = "The memory directory is /home/u/.claude/projects/alpha/memory. Today is Monday."
SYSTEM = PART1 + "\n" + PART2  # two system blocks, joined as the router joins them
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
READ = {"type": "function", "function": {
    "name": "read_file", "description": "Read a text file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'}}


def conversation(last: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Read a.txt please."},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "hello from a.txt"},
            {"role": "user", "content": last}]


POINTS = {
    "tools": CacheBreakpoint(TTL_1H_S, num_tools=2),
    "system part 1": CacheBreakpoint(message_index=0, content_chars=len(PART1)),
    "system": CacheBreakpoint(message_index=0),
    "tool result": CacheBreakpoint(message_index=3),
    "last user": CacheBreakpoint(message_index=4),
}


@pytest.fixture(scope="module", params=["smollm2", "qwen2.5-coder"])
def tokenizer(request: pytest.FixtureRequest, default_model_dir: Path) -> Any:
    """The real tokenizers: SmolLM2's template has no tools (mlxd's fallback puts them in
    the system text), Qwen2.5's renders them after the system text."""
    if request.param == "smollm2":
        return load_tokenizer(default_model_dir)
    return load_tokenizer(request.getfixturevalue("qwen_model_dir"))


def positions(tokenizer: Any, messages: list[dict[str, Any]], points: list[CacheBreakpoint]) -> tuple[list[int], str]:
    ids = render_chat(tokenizer, messages, [WEATHER, READ])
    found = breakpoint_positions(lambda m, t: render_chat(tokenizer, m, t, generation_prompt=False), messages,
                                 [WEATHER, READ], points, ids)
    assert len(found) == len(points)
    return [p.tokens for p in found], tokenizer.decode(ids)


def prefix_text(tokenizer: Any, messages: list[dict[str, Any]], num_tokens: int) -> str:
    return tokenizer.decode(render_chat(tokenizer, messages, [WEATHER, READ])[:num_tokens])


def test_each_breakpoint_ends_at_its_block(tokenizer: Any) -> None:
    messages = conversation("Now summarise it.")
    found, text = positions(tokenizer, messages, list(POINTS.values()))
    at = dict(zip(POINTS, found))
    prefixes = {name: prefix_text(tokenizer, messages, n) for name, n in at.items()}
    for name, prefix in prefixes.items():
        assert text.startswith(prefix), name  # a true prefix of the prompt
    # each prefix holds its block's text (all but a token that merges with what follows
    # the block in the whole prompt), and nothing of the next message's
    assert PART1[:-2] in prefixes["system part 1"] and PART2[:12] not in prefixes["system part 1"]
    assert SYSTEM in prefixes["system"] and "Read a.txt" not in prefixes["system"]
    assert "hello from a.txt" in prefixes["tool result"] and "Now summarise" not in prefixes["tool result"]
    assert "Now summarise it" in prefixes["last user"]
    assert prefixes["last user"].endswith("Now summarise it.<|im_end|>\n")  # the generation prompt is not in it
    assert prefixes["system"].endswith("<|im_end|>\n")  # its whole turn (Qwen's holds the tools too)
    # the tools come with the system text in both templates (Qwen renders it first; the
    # fallback puts the tools in the system prompt)
    assert "read_file" in prefixes["tools"] and "get_weather" in prefixes["tools"]
    assert "Read a.txt" not in prefixes["tools"]
    assert at["system part 1"] < at["system"] < at["tool result"] < at["last user"] <= len(
        render_chat(tokenizer, messages, [WEATHER, READ]))
    # the whole system message ends at the template's end of turn, past the text itself
    assert len(prefixes["system"]) >= text.index(SYSTEM) + len(SYSTEM)


def test_a_breakpoint_falls_on_the_same_token_in_every_request_that_shares_its_prefix(tokenizer: Any) -> None:
    """What makes the pinned blocks the next request's hit: the position depends only on
    what comes before the point."""
    points = [POINTS["tools"], POINTS["system part 1"], POINTS["system"], POINTS["tool result"]]
    first, _ = positions(tokenizer, conversation("Now summarise it."), points)
    again, _ = positions(tokenizer, conversation("Now summarise it."), points)
    other, _ = positions(tokenizer, conversation("Something else entirely, with more words in it."), points)
    assert first == again == other


def test_a_later_system_text_does_not_move_an_earlier_breakpoint(tokenizer: Any) -> None:
    base = conversation("Go on.")
    noted = [*base, {"role": "system", "content": "Note: the user prefers short answers."},
             {"role": "user", "content": "And then?"}]
    points = [POINTS["system"], POINTS["tool result"]]
    assert positions(tokenizer, base, points)[0] == positions(tokenizer, noted, points)[0]


def test_cut_request() -> None:
    messages = [{"role": "system", "content": "abc def"}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "ok", "tool_calls": [CALL]}]
    assert cut_request(messages, [WEATHER], CacheBreakpoint(message_index=0, content_chars=3)) == (
        [{"role": "system", "content": "abc"}], [WEATHER])
    assert cut_request(messages, [WEATHER], CacheBreakpoint(message_index=2, content_chars=1)) == (
        [*messages[:2], {"role": "assistant", "content": "o"}], [WEATHER])
    assert cut_request(messages, [WEATHER], CacheBreakpoint(message_index=2)) == (messages, [WEATHER])
    assert cut_request(messages, [WEATHER, READ], CacheBreakpoint(num_tools=1)) == (
        [messages[0], {"role": "user", "content": ""}], [WEATHER])
    assert cut_request(messages[1:], None, CacheBreakpoint(num_tools=1)) == ([{"role": "user", "content": ""}], None)
    with pytest.raises(ValueError):
        cut_request(messages, None, CacheBreakpoint(message_index=3))


def test_a_breakpoint_that_does_not_render_is_left_out() -> None:
    def render(messages: list[dict[str, Any]], tools: Any) -> list[int]:
        if len(messages) == 1:
            raise ValueError("this template needs a user message")
        return [ord(c) for c in "".join(m["content"] for m in messages)]

    messages = [{"role": "system", "content": "ab"}, {"role": "user", "content": "cd"}]
    found = breakpoint_positions(render, messages, None, [CacheBreakpoint(message_index=0),
                                                          CacheBreakpoint(message_index=1),
                                                          CacheBreakpoint(message_index=5)], [97, 98, 99, 100])
    assert found == [BreakpointPosition(4, TTL_5M_S)]


@pytest.mark.parametrize("points, cached, creation", [
    ([], 500, CacheCreation()),  # no breakpoint: nothing is reported written
    ([(800, TTL_5M_S)], 0, CacheCreation(800, 0)),  # first request: everything up to it
    ([(800, TTL_5M_S)], 768, CacheCreation(32, 0)),  # a later one: only what its hit lacked
    ([(800, TTL_5M_S)], 1024, CacheCreation()),  # a hit past the breakpoint writes nothing
    ([(300, TTL_1H_S), (800, TTL_5M_S)], 0, CacheCreation(800, 300)),  # 1h up to the 1h breakpoint
    ([(300, TTL_1H_S), (800, TTL_5M_S)], 512, CacheCreation(288, 0)),
    ([(800, TTL_1H_S), (300, TTL_5M_S)], 256, CacheCreation(544, 544)),
])
def test_cache_creation(points: list[tuple[int, int]], cached: int, creation: CacheCreation) -> None:
    assert cache_creation([BreakpointPosition(n, ttl) for n, ttl in points], cached) == creation
