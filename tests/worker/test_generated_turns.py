"""worker.generated_turns through render_chat, with Qwen2.5-Coder's real tokenizer and
template: the turn after a tool call renders the call as exactly the tokens the model
generated (what the prefix cache holds), and anything it cannot splice renders as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mlx_lm.utils import load_tokenizer

from protocol.generated_turns import GENERATED_TOKENS
from tests.worker import chat_templates
from worker.common_prefix import common_prefix
from worker.prompts import render_chat

READ = {"type": "function", "function": {
    "name": "Read", "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"file_path": {"type": "string"}, "limit": {"type": "integer"}},
                   "required": ["file_path"]}}}
TURN1 = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "What is in main.py?"}]
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "Read", "arguments": '{"file_path": "/tmp/p/main.py", "limit": 20}'}}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "print('hi')"}
# what Qwen2.5-Coder-0.5B writes for such a call (greedy), none of which the template would
# render from the call: a bare object, keys in another order, a fenced block, text before it
GENERATIONS = [
    '{"name": "Read", "arguments": {"file_path": "/tmp/p/main.py", "limit": 20}}',
    '<tool_call>\n{"name": "Read", "arguments": {"limit": 20, "file_path": "/tmp/p/main.py"}}\n</tool_call>',
    '```json\n{"name": "Read", "arguments": {"file_path": "/tmp/p/main.py", "limit": 20}}\n```',
    'Let me read it.\n\n<tool_call>\n{"name": "Read", "arguments": {"file_path": "/tmp/p/main.py", "limit": 20}}\n</tool_call>',
]


@pytest.fixture(scope="module")
def tokenizer(qwen_model_dir: Path) -> Any:
    return load_tokenizer(qwen_model_dir)


def turn2(generated: list[int] | None, content: str = "") -> list[dict[str, Any]]:
    call_turn: dict[str, Any] = {"role": "assistant", "content": content, "tool_calls": [CALL]}
    if generated is not None:
        call_turn[GENERATED_TOKENS] = generated
    return [*TURN1, call_turn, RESULT]


@pytest.mark.parametrize("generated_text", GENERATIONS)
def test_the_turn_after_a_call_starts_with_turn_one_and_the_generated_tokens(tokenizer: Any,
                                                                             generated_text: str) -> None:
    prompt1 = render_chat(tokenizer, TURN1, [READ])
    generated = tokenizer.encode(generated_text, add_special_tokens=False)
    content = generated_text.split("\n\n")[0] if generated_text.startswith("Let") else ""
    prompt2 = render_chat(tokenizer, turn2(generated, content), [READ])
    cached = prompt1 + generated  # what the prefix cache holds after turn 1
    assert prompt2[: len(cached)] == cached
    # and what follows is the template's end of that turn and the result, as it renders them
    rendered = tokenizer.decode(prompt2[len(cached):])
    assert rendered.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\nprint('hi')\n</tool_response>")
    # without the mark the template spells the call its own way: the cache would miss from there
    plain = render_chat(tokenizer, turn2(None, content), [READ])
    assert common_prefix(plain, cached) < len(cached)


def test_the_generated_ids_go_in_as_they_were_not_as_their_text_retokenizes(tokenizer: Any) -> None:
    """A model may write a text in tokens the tokenizer would not choose (here one
    character at a time): the prompt repeats those tokens, which the cache holds."""
    text = '<tool_call>\n{"name": "Read", "arguments": {"file_path": "/tmp/p/main.py", "limit": 20}}\n</tool_call>'
    canonical = tokenizer.encode(text, add_special_tokens=False)
    at = next(i for i, t in enumerate(canonical) if len(tokenizer.decode([t])) > 3)  # a token of several characters
    spelled = [t for ch in tokenizer.decode([canonical[at]]) for t in tokenizer.encode(ch, add_special_tokens=False)]
    generated = canonical[:at] + spelled + canonical[at + 1:]
    assert generated != canonical and tokenizer.decode(generated) == text
    prompt1 = render_chat(tokenizer, TURN1, [READ])
    prompt2 = render_chat(tokenizer, turn2(generated), [READ])
    assert prompt2[: len(prompt1) + len(generated)] == prompt1 + generated


def test_several_generated_turns_each_keep_their_tokens(tokenizer: Any) -> None:
    first = tokenizer.encode(GENERATIONS[0], add_special_tokens=False)
    second = tokenizer.encode(GENERATIONS[2], add_special_tokens=False)
    call2 = {**CALL, "id": "call_2"}
    messages = [*turn2(first), {"role": "assistant", "content": "", "tool_calls": [call2], GENERATED_TOKENS: second},
                {**RESULT, "tool_call_id": "call_2"}]
    prompt2 = render_chat(tokenizer, turn2(first), [READ])
    prompt3 = render_chat(tokenizer, messages, [READ])
    cached = prompt2 + second
    assert prompt3[: len(cached)] == cached


def test_bad_marks_render_as_the_template_does(tokenizer: Any) -> None:
    plain = render_chat(tokenizer, turn2(None), [READ])
    vocab = len(tokenizer.get_vocab())
    for mark in ([], [vocab + 5], ["x"], "abc"):
        assert render_chat(tokenizer, turn2(mark), [READ], vocab_size=vocab) == plain  # type: ignore[arg-type]


def test_a_template_that_changes_the_turn_renders_without_the_marks(tokenizer: Any) -> None:
    """A template whose assistant turn does not start right after its generation prompt
    (here one that upper-cases the content) gets no splice: the marks are dropped."""
    original = tokenizer.chat_template
    tokenizer._tokenizer.chat_template = chat_templates.QWEN25.replace(
        "'\\n' + message.content + '<|im_end|>'", "'\\nSAID: ' + message.content + '<|im_end|>'")
    try:
        generated = tokenizer.encode(GENERATIONS[0], add_special_tokens=False)
        marked = render_chat(tokenizer, turn2(generated), [READ])
        assert marked == render_chat(tokenizer, turn2(None), [READ])
    finally:
        tokenizer._tokenizer.chat_template = original


THOUGHT = "The user wants main.py read."


@pytest.mark.parametrize("opens_in_prompt", [False, True])
def test_a_reasoning_turn_renders_back_as_its_generated_tokens(tokenizer: Any, opens_in_prompt: bool) -> None:
    """Both ways a template opens the span (the model writes `<think>`, or the generation
    prompt does): the turn after a reasoning call starts with turn one and every token the
    model generated, its reasoning included; without the mark the template respells it."""
    original = tokenizer.chat_template
    tokenizer._tokenizer.chat_template = chat_templates.thinking(opens_in_prompt)
    try:
        prompt1 = render_chat(tokenizer, TURN1, [READ])
        # its own spacing, and the call's keys in its own order: the template respells both
        written = ("" if opens_in_prompt else "<think>\n") + f"{THOUGHT}\n\n</think>\n\n{GENERATIONS[1]}"
        generated = tokenizer.encode(written, add_special_tokens=False)
        history = turn2(generated)
        history[-2]["reasoning_content"] = THOUGHT
        cached = prompt1 + generated
        assert render_chat(tokenizer, history, [READ])[: len(cached)] == cached
        plain = render_chat(tokenizer, [{k: v for k, v in m.items() if k != GENERATED_TOKENS} for m in history],
                            [READ])
        assert THOUGHT in tokenizer.decode(plain) and common_prefix(plain, cached) < len(cached)  # the control
        # a turn the template shows without its reasoning (before a later user message) is not spliced
        later = [*history, {"role": "assistant", "content": "It prints hi."}, {"role": "user", "content": "Thanks"}]
        bare = [{k: v for k, v in m.items() if k != GENERATED_TOKENS} for m in later]
        assert render_chat(tokenizer, later, [READ]) == render_chat(tokenizer, bare, [READ])
        assert THOUGHT not in tokenizer.decode(render_chat(tokenizer, later, [READ]))
    finally:
        tokenizer._tokenizer.chat_template = original
