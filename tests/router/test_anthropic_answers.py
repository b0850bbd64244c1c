"""Anthropic answers: content blocks from the tool-call parser, stop reasons, usage and
the error mapping, without a worker."""

from __future__ import annotations

import json

import pytest

from protocol.errors import RequestError, WorkerDead
from protocol.messages import FinishEvent, Usage
from protocol.tool_dialects import MLXD
from router.api.anthropic_answers import ContentBlocks, final_usage, stop_reason
from router.api.anthropic_errors import request_error_status, stream_error_body
from router.sse import sse_event
from router.tool_calls import ToolRequest, ToolSpec, make_parser

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def blocks_for(pieces: list[str]) -> tuple[ContentBlocks, list[dict]]:
    request = ToolRequest((ToolSpec("get_weather", {"type": "object"}),))
    blocks = ContentBlocks(make_parser(request, MLXD))
    events = [event for piece in pieces for event in blocks.feed(piece)] + blocks.finish()
    return blocks, events


@pytest.mark.parametrize("cut", [1, 3, 7, len(CALL)])
def test_text_then_a_call_streams_as_two_blocks_whatever_the_cuts(cut: int) -> None:
    answer = "I'll look. " + CALL
    blocks, events = blocks_for([answer[i:i + cut] for i in range(0, len(answer), cut)])
    assert [b["type"] for b in blocks.content] == ["text", "tool_use"]
    assert blocks.content[0]["text"] == "I'll look."
    call = blocks.content[1]
    assert call["name"] == "get_weather" and call["input"] == {"city": "Paris"} and call["id"].startswith("toolu_")
    kinds = [(e["type"], e.get("index")) for e in events if e["type"] != "content_block_delta"]
    assert kinds == [("content_block_start", 0), ("content_block_stop", 0),
                     ("content_block_start", 1), ("content_block_stop", 1)]
    start = [e for e in events if e["type"] == "content_block_start"][1]
    assert start["content_block"]["input"] == {}
    partial = "".join(e["delta"]["partial_json"] for e in events
                      if e["type"] == "content_block_delta" and e["index"] == 1)
    assert json.loads(partial) == {"city": "Paris"}


def test_plain_text_without_tools_and_an_empty_answer() -> None:
    blocks = ContentBlocks(None)
    events = blocks.feed("Hello") + blocks.feed("!") + blocks.finish()
    assert blocks.content == [{"type": "text", "text": "Hello!"}]
    assert [e["type"] for e in events] == ["content_block_start", "content_block_delta", "content_block_delta",
                                           "content_block_stop"]
    empty = ContentBlocks(None)
    assert empty.finish() == [] and empty.content == []


def test_keepalives_open_an_empty_text_block_that_the_answer_continues() -> None:
    """A long prefill's keep-alives are real content events (Claude Code's watchdog skips
    pings) that change no answer: text continues the block they opened."""
    blocks = ContentBlocks(None)
    first, second = blocks.keepalive(), blocks.keepalive()
    assert first == [{"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}]
    assert second == [{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": ""}}]
    events = blocks.feed("Hi") + blocks.finish()
    assert blocks.content == [{"type": "text", "text": "Hi"}]
    assert [(e["type"], e["index"]) for e in events] == [("content_block_delta", 0), ("content_block_stop", 0)]


def test_a_call_after_keepalives_follows_their_empty_text_block() -> None:
    request = ToolRequest((ToolSpec("get_weather", {"type": "object"}),))
    blocks = ContentBlocks(make_parser(request, MLXD))
    blocks.keepalive()
    events = blocks.feed(CALL) + blocks.finish()
    assert [b["type"] for b in blocks.content] == ["text", "tool_use"] and blocks.content[0]["text"] == ""
    assert blocks.content[1]["input"] == {"city": "Paris"}
    assert events[0] == {"type": "content_block_stop", "index": 0}
    partial = "".join(e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta")
    assert json.loads(partial) == {"city": "Paris"}


@pytest.mark.parametrize("reason, sequence, calls, expected", [
    ("stop", None, False, ("end_turn", None)),
    ("length", None, True, ("max_tokens", None)),
    ("stop", "END", False, ("stop_sequence", "END")),
    ("stop", None, True, ("tool_use", None)),
])
def test_stop_reasons(reason: str, sequence: str | None, calls: bool, expected: tuple) -> None:
    blocks, _ = blocks_for([CALL] if calls else ["hi"])
    finish = FinishEvent("r", reason, Usage(10, 2), stop_sequence=sequence)
    assert stop_reason(finish, blocks) == expected


def test_usage_splits_cached_tokens_out() -> None:
    assert final_usage(Usage(prompt_tokens=300, completion_tokens=5, cached_tokens=256)) == {
        "input_tokens": 44, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 256, "output_tokens": 5,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0}}


@pytest.mark.parametrize("usage, expected", [
    # a breakpoint at token 700 of a 900-token prompt, 256 of them cached: 444 written, 200 after it
    (Usage(900, 5, 256, cache_creation_tokens=444), (200, 444, 256, 444, 0)),
    (Usage(900, 5, 0, cache_creation_tokens=700, cache_creation_1h_tokens=300), (200, 700, 0, 400, 300)),
    (Usage(900, 5, 899), (1, 0, 899, 0, 0)),  # a hit past the breakpoint (or none): nothing written
])
def test_usage_reports_what_breakpoints_wrote(usage: Usage, expected: tuple[int, ...]) -> None:
    body = final_usage(usage)
    split = body["cache_creation"]
    assert (body["input_tokens"], body["cache_creation_input_tokens"], body["cache_read_input_tokens"],
            split["ephemeral_5m_input_tokens"], split["ephemeral_1h_input_tokens"]) == expected
    assert body["input_tokens"] + body["cache_creation_input_tokens"] + body["cache_read_input_tokens"] == 900


@pytest.mark.parametrize("error, status, kind, starts", [
    (RequestError("busy", status=503, error_type="server_busy", code="queue_full"), 529, "overloaded_error", "busy"),
    (RequestError("prompt is 9000 tokens ...", code="context_length_exceeded", num_prompt_tokens=9000,
                  context_window=8192), 400, "invalid_request_error", "prompt is too long: 9000 tokens > 8192 maximum"),
    (RequestError("no such model", status=404), 404, "not_found_error", "no such model"),
    (RequestError("boom", status=500, error_type="server_error"), 500, "api_error", "boom"),
    (RequestError("too big", status=413), 413, "request_too_large", "too big"),
])
def test_errors_map_to_anthropic_types(error: RequestError, status: int, kind: str, starts: str) -> None:
    got_status, got_kind, message = request_error_status(error)
    assert (got_status, got_kind) == (status, kind) and message.startswith(starts)


def test_a_stream_error_is_an_error_event() -> None:
    body = stream_error_body(WorkerDead("worker died"))
    assert body == {"type": "error", "error": {"type": "overloaded_error", "message": "worker died"}}
    assert sse_event(body).startswith(b"event: error\ndata: {")
