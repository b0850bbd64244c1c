"""The Responses API without a worker: a body -> the chat request it forwards, and the
answer's text -> output items and the typed event stream (sequence numbers, keep-alives,
calls with their namespace, cut and failed answers)."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace
from typing import Any

import pytest

from protocol.errors import RequestError
from protocol.messages import FinishEvent, Usage
from protocol.tool_dialects import HERMES
from router.api.openai_responses import parse
from router.api.response_store import ResponseStore
from router.api.responses_answers import OutputAssembler, ResponsesRequest
from router.reasoning_split import AnswerSplit, ReasoningMarkers
from router.tool_calls import make_parser

SHELL = {"type": "function", "name": "shell", "description": "Run a command.",
         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
NAMESPACE = {"type": "namespace", "name": "files", "tools": [
    {"type": "function", "name": "read_file", "parameters": {"type": "object"}}]}
CALL = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call>'


def request(**fields: Any) -> ResponsesRequest:
    body = {"model": "m", "input": "hi", **fields}
    return dataclasses.replace(parse(body, store=ResponseStore()), tool_dialect=HERMES)


def assembler(parsed: ResponsesRequest) -> OutputAssembler:
    parser = make_parser(parsed.tools, parsed.tool_dialect, parsed.response_id) if parsed.tools else None
    return OutputAssembler(parsed, parser)


def finish(reason: str = "stop") -> FinishEvent:
    return FinishEvent(request_id="r", finish_reason=reason, usage=Usage(prompt_tokens=30, completion_tokens=5,
                                                                         cached_tokens=16))


def test_a_text_answer_streams_in_order_with_keepalives_numbered_in_line() -> None:
    answer = assembler(request())
    events = answer.start() + [answer.keepalive()] + answer.feed("Hel") + answer.feed("lo") + answer.finish(finish())
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[2]["response"]["status"] == "in_progress" and events[2]["response"]["output"] == []
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["output"][0]["content"][0]["text"] == "Hello"
    assert final["usage"] == {"input_tokens": 30, "input_tokens_details": {"cached_tokens": 16}, "output_tokens": 5,
                              "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 35}


def test_a_call_to_a_namespaced_function_names_its_namespace() -> None:
    parsed = request(tools=[SHELL, NAMESPACE, {"type": "web_search"}])
    assert [spec.name for spec in parsed.tools.tools] == ["shell", "read_file"]  # flattened; web_search dropped
    assert [tool["type"] for tool in parsed.echo["tools"]] == ["function", "namespace"]
    answer = assembler(parsed)
    events = answer.start() + answer.feed("Reading. ") + answer.feed(CALL) + answer.finish(finish())
    kinds = [item["type"] for item in events[-1]["response"]["output"]]
    assert kinds == ["message", "function_call"]
    call = events[-1]["response"]["output"][1]
    assert call["name"] == "read_file" and call["namespace"] == "files" and call["status"] == "completed"
    assert json.loads(call["arguments"]) == {"path": "a.txt"}
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert deltas == call["arguments"]
    assert answer.answer_messages() == [{"role": "assistant", "content": "Reading.", "tool_calls": [
        {"id": call["call_id"], "type": "function", "function": {"name": "read_file",
                                                                 "arguments": call["arguments"]}}]}]


def test_a_cut_answer_is_incomplete_and_an_empty_one_still_has_a_message() -> None:
    answer = assembler(request())
    events = answer.start() + answer.feed("Once upon") + answer.finish(finish("length"))
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert events[-1]["response"]["output"][0]["status"] == "incomplete"
    empty = assembler(request())
    final = (empty.start() + empty.finish(finish()))[-1]["response"]
    assert final["output"][0]["type"] == "message" and final["output"][0]["content"][0]["text"] == ""


def test_a_failure_mid_answer_keeps_the_text_so_far() -> None:
    answer = assembler(request())
    answer.start()
    answer.feed("partial")
    failed = answer.fail({"code": "worker_unavailable", "message": "restarting"})[0]
    assert failed["type"] == "response.failed"
    assert failed["response"]["error"] == {"code": "worker_unavailable", "message": "restarting"}
    assert failed["response"]["output"][0]["status"] == "incomplete"
    assert failed["response"]["output"][0]["content"][0]["text"] == "partial"


def test_input_items_become_chat_messages() -> None:
    parsed = request(instructions="Be brief.", input=[
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Rules."}]},
        {"role": "user", "content": "Read a.txt"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "xyz"},
        {"type": "function_call", "call_id": "c1", "name": "read_file", "arguments": "{\"path\": \"a.txt\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "hello"},
    ])
    messages = parsed.add.messages
    # developer turns render as system ones: chat templates know no developer role
    assert [m["role"] for m in messages] == ["system", "system", "user", "assistant", "tool"]
    assert messages[0]["content"] == "Be brief." and messages[3]["tool_calls"][0]["function"]["name"] == "read_file"
    assert messages[4]["content"] == "hello" and messages[4]["tool_call_id"] == "c1"
    assert parsed.conversation[0]["content"] == "Rules."  # instructions are not stored with the conversation
    assert "reasoning_content" not in messages[3]  # encrypted reasoning of another model: nothing to render


def test_a_reasoning_item_goes_to_the_assistant_turn_after_it_and_the_store_keeps_ours() -> None:
    parsed = request(input=[
        {"role": "user", "content": "Read a.txt"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Use "},
                                                                       {"type": "reasoning_text", "text": "read."}]},
        {"type": "function_call", "call_id": "c1", "name": "read_file", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "hello"},
        {"type": "reasoning", "id": "rs_2", "summary": [], "content": [{"type": "reasoning_text", "text": "Done."}]},
        {"role": "assistant", "content": "It says hello."},
    ])
    assert [m.get("reasoning_content") for m in parsed.add.messages] == [None, "Use read.", None, "Done."]
    with pytest.raises(RequestError):
        request(input=[{"type": "reasoning", "id": "rs_1", "content": "not a list"}, {"role": "user", "content": "x"}])
    stream = SimpleNamespace(request=SimpleNamespace(reasoning=ReasoningMarkers(opens_in_prompt=True)))
    answer = OutputAssembler(request(), None, AnswerSplit(stream))
    answer.start()
    answer.feed("Think.</think>\n\nHi")
    answer.finish(finish())
    assert answer.answer_messages() == [{"role": "assistant", "content": "Hi", "reasoning_content": "Think."}]


@pytest.mark.parametrize("fields, param", [
    ({"input": 7}, "input"),
    ({"input": []}, "input"),
    ({"previous_response_id": "resp_unknown"}, "previous_response_id"),
    ({"tools": [{"type": "function"}]}, "tools"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
])
def test_bad_bodies_are_400s_naming_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as raised:
        request(**fields)
    assert raised.value.status == 400 and raised.value.param == param
