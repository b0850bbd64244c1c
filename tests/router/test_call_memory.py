"""router.call_memory: an answer with calls is found again under the ids its client got,
and marks a history turn only when that turn says exactly what the answer said."""

from __future__ import annotations

import json
from typing import Any

from protocol.generated_turns import GENERATED_TOKENS
from protocol.tool_dialects import HERMES
from router.api.anthropic_answers import tool_use_id
from router.call_memory import CallMemory, GeneratedAnswer
from router.reasoning_split import ReasoningMarkers
from router.tool_calls import ToolRequest, ToolSpec, gather, make_parser

TOOLS = ToolRequest((ToolSpec("Read"), ToolSpec("Glob")))
MODEL = "qwen2.5-coder-0.5b"
TEXT = 'Reading both.\n<tool_call>\n{"name": "Read", "arguments": {"file_path": "/a.py", "limit": 5}}\n</tool_call>\n' \
       '<tool_call>\n{"name": "Glob", "arguments": {"pattern": "*.py"}}\n</tool_call>'
IDS = list(range(100, 140))


def answered(memory: CallMemory, request_id: str = "chatcmpl-1", text: str = TEXT) -> tuple[str, list[Any]]:
    """Remember `text` as the answer to `request_id`; what its client got (text and calls),
    from the parser the answer modules use."""
    answer = GeneratedAnswer()
    for i in range(0, len(text), 7):  # streamed in pieces, as TokenEvents come
        answer.add(text[i:i + 7], IDS[i // 7 : i // 7 + 1] if i // 7 < len(IDS) else [])
    memory.remember(MODEL, request_id, TOOLS, HERMES, answer)
    parser = make_parser(TOOLS, HERMES, request_id)
    return gather(parser.feed(text) + parser.finish())


def history(content: str, calls: list[Any], **changes: Any) -> list[dict[str, Any]]:
    turn = {"role": "assistant", "content": content,
            "tool_calls": [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                           for c in calls]}
    turn.update(changes)
    return [{"role": "user", "content": "go"}, turn, {"role": "tool", "tool_call_id": calls[0].id, "content": "x"}]


def test_an_unchanged_turn_is_marked_with_the_answers_token_ids() -> None:
    memory = CallMemory()
    content, calls = answered(memory)
    assert content == "Reading both." and [c.name for c in calls] == ["Read", "Glob"]
    marked = memory.mark(MODEL, history(content, calls))
    assert marked[1][GENERATED_TOKENS] == IDS[: len(marked[1][GENERATED_TOKENS])]
    assert len(marked[1][GENERATED_TOKENS]) == -(-len(TEXT) // 7)
    assert GENERATED_TOKENS not in marked[0] and GENERATED_TOKENS not in marked[2]
    assert memory.num_marked == 1


def test_the_same_answer_parsed_again_has_the_same_call_ids() -> None:
    _, first = answered(CallMemory(), "msg_1")
    _, again = answered(CallMemory(), "msg_1")
    _, other = answered(CallMemory(), "msg_2")
    assert [c.id for c in first] == [c.id for c in again]
    assert {c.id for c in first}.isdisjoint(c.id for c in other)
    assert len({c.id for c in first}) == 2


def test_reordered_keys_and_anthropic_ids_still_match() -> None:
    """A client may re-serialize arguments (other key order, other spacing) and Anthropic's
    answers rename `call_X` to `toolu_X`: the same calls, so the same tokens."""
    memory = CallMemory()
    content, calls = answered(memory)
    turn = history(content, calls)
    for call in turn[1]["tool_calls"]:
        arguments = json.loads(call["function"]["arguments"])
        call["function"]["arguments"] = json.dumps(dict(reversed(list(arguments.items()))), separators=(",", ":"))
        call["id"] = tool_use_id(call["id"])
    assert GENERATED_TOKENS in memory.mark(MODEL, turn)[1]


def test_any_change_of_meaning_renders_from_the_calls() -> None:
    memory = CallMemory()
    content, calls = answered(memory)
    changed = [
        history("Reading all.", calls),  # other text
        history(content, calls[:1]),  # a call left out
        history(content, calls[::-1]),  # calls in another order
    ]
    other_args = history(content, calls)
    other_args[1]["tool_calls"][0]["function"]["arguments"] = '{"file_path": "/b.py", "limit": 5}'
    other_name = history(content, calls)
    other_name[1]["tool_calls"][1]["function"]["name"] = "Read"
    other_id = history(content, calls)
    other_id[1]["tool_calls"][1]["id"] = "call_elsewhere"
    for messages in [*changed, other_args, other_name, other_id]:
        assert all(GENERATED_TOKENS not in m for m in memory.mark(MODEL, messages))
    # another model generated other tokens
    assert all(GENERATED_TOKENS not in m for m in memory.mark("other-model", history(content, calls)))


def test_a_mark_sent_by_a_client_is_dropped() -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x", GENERATED_TOKENS: [1, 2]}]
    assert all(GENERATED_TOKENS not in m for m in CallMemory().mark(MODEL, messages))


def test_answers_without_calls_are_not_kept_and_the_memory_is_bounded() -> None:
    memory = CallMemory(capacity=3)
    answered(memory, "r0", "just text")
    assert len(memory) == 0
    for i in range(1, 4):
        answered(memory, f"r{i}")  # two calls each
    assert len(memory) == 3
    content, oldest = answered(CallMemory(), "r1")
    assert all(GENERATED_TOKENS not in m for m in memory.mark(MODEL, history(content, oldest)))
    content, newest = answered(CallMemory(), "r3")
    assert GENERATED_TOKENS in memory.mark(MODEL, history(content, newest))[1]


def test_calls_written_outside_the_markup_are_rendered_back_in_it() -> None:
    """A bare JSON call (the parser still finds it) is not remembered: rendered as the model
    wrote it, the history would teach the model that form."""
    memory = CallMemory()
    bare = '{"name": "Read", "arguments": {"file_path": "/a.py"}}'
    content, calls = answered(memory, text=bare)
    assert [c.name for c in calls] == ["Read"]  # a call to the client all the same
    assert len(memory) == 0
    assert GENERATED_TOKENS not in memory.mark(MODEL, history(content, calls))[1]


def test_always_remembers_calls_written_outside_the_markup() -> None:
    memory = CallMemory(markup_only=False)
    content, calls = answered(memory, text='{"name": "Read", "arguments": {"file_path": "/a.py"}}')
    assert GENERATED_TOKENS in memory.mark(MODEL, history(content, calls))[1]


def test_a_reasoning_answer_is_found_beside_the_reasoning_its_client_got() -> None:
    """The span is split off as the client got it: the turn is marked when it carries that
    reasoning back (chat `reasoning_content`, what Anthropic thinking blocks become), and
    not when it leaves it out or changes it (the generated ids hold it)."""
    memory = CallMemory()
    answer = GeneratedAnswer()
    written = "Both files.\n</think>\n\n" + TEXT
    for i in range(0, len(written), 7):
        answer.add(written[i:i + 7], [1000 + i])
    memory.remember(MODEL, "chatcmpl-r", TOOLS, HERMES, answer, ReasoningMarkers(opens_in_prompt=True))
    content, calls = gather(make_parser(TOOLS, HERMES, "chatcmpl-r").feed(TEXT))
    assert GENERATED_TOKENS in memory.mark(MODEL, history(content, calls, reasoning_content="Both files."))[1]
    for other in ({}, {"reasoning_content": "Other."}):
        assert GENERATED_TOKENS not in memory.mark(MODEL, history(content, calls, **other))[1]
    memory.remember(MODEL, "chatcmpl-r", TOOLS, HERMES, answer)  # the control: unsplit, the text differs
    assert GENERATED_TOKENS not in memory.mark(MODEL, history(content, calls, reasoning_content="Both files."))[1]
