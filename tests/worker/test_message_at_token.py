"""Which message renders a prompt token (`worker.message_at_token`), with the real
tokenizers and chat templates of SmolLM2 (tools in mlxd's fallback dialect) and
Qwen2.5-Coder (tools in its system turn, Hermes calls): every token of a conversation
with a system prompt, tools, a call, its result and a last user turn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mlx_lm.tokenizer_utils import load

from protocol.cache_misses import Divergence
from protocol.messages import AddRequest
from worker.message_at_token import common_prefix_chars, locate
from worker.prompts import render_chat

TOOLS = [{"type": "function", "function": {"name": "read", "description": "Read a file",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]
MESSAGES = [
    {"role": "system", "content": "You are helpful. \u00e9\u00fc"},
    {"role": "user", "content": "Read a.py please"},
    {"role": "assistant", "content": "Sure.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"path": "a.py"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "print(1)"},
    {"role": "user", "content": "thanks"},
]
# each (message, field) in prompt order: the walk over every token meets them first in this order
EXPECTED = [(0, "system", "content"), (0, "system", "tools"), (1, "user", "content"), (2, "assistant", "content"),
            (2, "assistant", "tool_calls"), (3, "tool", "content"), (4, "user", "content"),
            (None, None, "generation_prompt")]


@pytest.fixture(scope="module", params=["default", "qwen"])
def tokenizer(request: pytest.FixtureRequest) -> Any:
    fixture = "default_model_dir" if request.param == "default" else "qwen_model_dir"
    path: Path = request.getfixturevalue(fixture)
    return load(path)


def test_every_token_names_its_message_and_field_in_order(tokenizer: Any) -> None:
    request = AddRequest("r", messages=MESSAGES, tools=TOOLS)
    ids = render_chat(tokenizer, MESSAGES, TOOLS)
    found = [locate(tokenizer, request, ids, i) for i in range(len(ids))]
    # in order of first appearance (a message's end-of-turn after its tools is its content again)
    assert list(dict.fromkeys((d.message_index, d.role, d.field) for d in found)) == EXPECTED
    user_text = tokenizer.decode(ids[[i for i, d in enumerate(found) if d.message_index == 4][0]:])
    assert "thanks" in user_text and "Read a.py" not in user_text


def test_no_messages_or_no_such_token_gives_the_token_alone(tokenizer: Any) -> None:
    assert locate(tokenizer, AddRequest("r", prompt="once upon"), [1, 2, 3], 1) == Divergence(1)
    assert locate(tokenizer, AddRequest("r", messages=MESSAGES), [1, 2], 7) == Divergence(7)


@pytest.mark.parametrize("a, b, n", [("", "", 0), ("abc", "abd", 2), ("abc", "abc", 3), ("abc", "abcde", 3),
                                     ("x", "y", 0)])
def test_common_prefix_chars(a: str, b: str, n: int) -> None:
    assert common_prefix_chars(a, b) == n
