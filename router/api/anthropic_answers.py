"""The Anthropic Messages answer to a forwarded request: one `message` body, or the SSE
stream of `message_start`, content-block events, `message_delta` and `message_stop`.

Text and tool calls come from the same parser (`router.tool_calls`) in both modes, so a
streamed answer adds up to the whole one. Streams start once the worker has taken the
prompt (tokenized, fits the window), before its prefill, so a refusal is still an HTTP
error; through a long prefill every keep-alive interval brings a `ping` and an empty
content delta (Claude Code's 300 s stream watchdog ignores pings); a client that goes away
aborts the request at the worker.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from protocol.errors import WorkerDead
from protocol.messages import (
    ErrorEvent,
    FinishEvent,
    Message,
    PromptEvent,
    TokenEvent,
    Usage,
)
from router.api.anthropic_errors import stream_error_body
from router.api.openai_answers import answer_whole
from router.api.openai_tool_calls import answer_parser
from router.reasoning_split import ANSWER, REASONING, AnswerSplit
from router.sse import EventStreamResponse, KeepAliveTimer, sse_event
from router.tool_calls import (
    ArgumentsDelta,
    CallEnd,
    CallStart,
    Event,
    TextDelta,
    ToolCallParser,
)
from router.tool_calls.late_parser import LateParser
from router.validation import ParsedRequest
from router.children.worker_client import RequestStream

logger = logging.getLogger(__name__)

PING = {"type": "ping"}


def usage_body(prompt_tokens: int, cached_tokens: int, output_tokens: int, creation_tokens: int = 0,
               creation_1h_tokens: int = 0) -> dict[str, Any]:
    """Anthropic's usage. `cache_read_input_tokens`: prompt tokens served from the prefix
    cache (hot tier or SSD); `cache_creation_input_tokens`: those up to the request's last
    `cache_control` breakpoint that it computed and wrote to the cache (0 without a
    breakpoint: mlxd caches every prompt unasked, and calls none of it created, as
    Anthropic reports no creation without one); `input_tokens`: the rest, computed and not
    under a breakpoint. The three add up to the prompt; `cache_creation` splits the
    creation by the breakpoints' TTL."""
    return {"input_tokens": prompt_tokens - cached_tokens - creation_tokens,
            "cache_creation_input_tokens": creation_tokens, "cache_read_input_tokens": cached_tokens,
            "cache_creation": {"ephemeral_5m_input_tokens": creation_tokens - creation_1h_tokens,
                               "ephemeral_1h_input_tokens": creation_1h_tokens},
            "output_tokens": output_tokens}


def final_usage(usage: Usage) -> dict[str, Any]:
    return usage_body(usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens, usage.cache_creation_tokens,
                      usage.cache_creation_1h_tokens)


def message_body(message_id: str, model: str, content: list[dict[str, Any]], stop_reason: str | None,
                 stop_sequence: str | None, usage: dict[str, Any], mlxd: dict[str, Any] | None = None
                 ) -> dict[str, Any]:
    """A `message` object: the whole answer, or (empty, no stop reason) `message_start`'s;
    `mlxd`: mlxd's own block, beside Anthropic's fields (SDKs keep unknown keys)."""
    body = {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": usage}
    if mlxd is not None:
        body["mlxd"] = mlxd
    return body


def tool_use_id(call_id: str) -> str:
    """A call id in Anthropic's style (`toolu_...`), from the parser's (`call_...`)."""
    return "toolu_" + call_id.removeprefix("call_")


class ContentBlocks:
    """One answer's text -> Anthropic content blocks: the stream's block events as the
    text arrives (`feed`, `finish`) and the whole `content` list they add up to.

    Invariants: at most one block is open, and it is the last of `content`; every block
    that was started is stopped by `finish`; a tool_use block's `input` is an object.
    """

    def __init__(self, parser: ToolCallParser | LateParser | None, split: AnswerSplit | None = None) -> None:
        self._parser = parser  # None: no tools offered, all text is text
        self._split = split  # None: nothing is reasoning
        self.content: list[dict[str, Any]] = []
        self._open: str | None = None  # type of the open block
        self._arguments = ""  # the open tool_use block's input, as JSON text so far

    @property
    def has_tool_use(self) -> bool:
        return any(block["type"] == "tool_use" for block in self.content)

    @property
    def extension(self) -> dict[str, Any] | None:
        """The answer's `mlxd` block once finished: `tool_calls` (calls read from text,
        repeats) when the request offered tools; None otherwise."""
        report = self._parser.report if isinstance(self._parser, LateParser) else None
        return {"tool_calls": report} if report is not None else None

    def feed(self, text: str) -> list[dict[str, Any]]:
        """The events `text`, the answer's next piece, settles."""
        return self._pieces(self._split.feed(text) if self._split is not None else [(ANSWER, text)])

    def _pieces(self, pieces: list[tuple[str, str]]) -> list[dict[str, Any]]:
        """Reasoning into a thinking block; the answer through the tool-call parser."""
        out: list[dict[str, Any]] = []
        for kind, text in pieces:
            if kind == REASONING:
                out += self._thinking(text)
            else:
                out += self._translate(self._parser.feed(text) if self._parser is not None else [TextDelta(text)])
        return out

    def _thinking(self, text: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self._open != "thinking":
            out += self._close()
            out.append(self._start({"type": "thinking", "thinking": "", "signature": ""}))
        self.content[-1]["thinking"] += text
        out.append(self._delta({"type": "thinking_delta", "thinking": text}))
        return out

    def keepalive(self) -> list[dict[str, Any]]:
        """Events that change no answer but count as stream activity: an empty delta to the
        open block, opening an empty text block if none is open.

        Claude Code aborts and resends a request after 300 s without a non-`ping` event
        (its `CLAUDE_STREAM_IDLE_TIMEOUT_MS` watchdog skips pings), and a 19k-token prompt
        prefills for longer than that on a small machine. An answer that then starts with
        a tool call carries an empty text block before it, which every client accepts.
        """
        if self._open is None:
            return [self._start({"type": "text", "text": ""})]
        if self._open == "tool_use":
            return [self._delta({"type": "input_json_delta", "partial_json": ""})]
        if self._open == "thinking":
            return [self._delta({"type": "thinking_delta", "thinking": ""})]
        return [self._delta({"type": "text_delta", "text": ""})]

    def finish(self) -> list[dict[str, Any]]:
        """The events still held at the end of the answer, and the last block's stop."""
        out = self._pieces(self._split.finish()) if self._split is not None else []
        out += self._translate(self._parser.finish()) if self._parser is not None else []
        return out + self._close()

    def _translate(self, events: list[Event]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for event in events:
            if isinstance(event, TextDelta) and event.text:
                if self._open != "text":
                    out += self._close()
                    out.append(self._start({"type": "text", "text": ""}))
                self.content[-1]["text"] += event.text
                out.append(self._delta({"type": "text_delta", "text": event.text}))
            elif isinstance(event, CallStart):
                out += self._close()
                out.append(self._start({"type": "tool_use", "id": tool_use_id(event.id), "name": event.name,
                                        "input": {}}))
            elif isinstance(event, ArgumentsDelta):
                self._arguments += event.fragment
                out.append(self._delta({"type": "input_json_delta", "partial_json": event.fragment}))
            elif isinstance(event, CallEnd):
                out += self._close()
        return out

    def _start(self, block: dict[str, Any]) -> dict[str, Any]:
        self.content.append(block)
        self._open, self._arguments = block["type"], ""
        return {"type": "content_block_start", "index": len(self.content) - 1, "content_block": dict(block)}

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": len(self.content) - 1, "delta": delta}

    def _close(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        out = []
        if self._open == "tool_use":
            self.content[-1]["input"] = _input_object(self._arguments)
        elif self._open == "thinking":  # the block's signature, sent last as Anthropic's is
            self.content[-1]["signature"] = thinking_signature(self.content[-1]["thinking"])
            out.append(self._delta({"type": "signature_delta", "signature": self.content[-1]["signature"]}))
        self._open = None
        return out + [{"type": "content_block_stop", "index": len(self.content) - 1}]


def thinking_signature(thinking: str) -> str:
    """A thinking block's `signature`: Anthropic's proves the block came from its model;
    mlxd's is a digest of the text (clients send it back unchanged and mlxd re-reads the
    history's reasoning as the model wrote it, not by signature)."""
    return "mlxd-" + hashlib.blake2b(thinking.encode(), digest_size=16).hexdigest()


def _input_object(arguments: str) -> dict[str, Any]:
    """A call's arguments as an object (the parser only completes calls whose arguments are
    a JSON object; anything else would be a parser bug, logged and sent as {})."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        value = None
    if not isinstance(value, dict):
        logger.error("tool call arguments are not a JSON object: %r", arguments[:200])
        return {}
    return value


def _content_blocks(parsed: ParsedRequest, stream: RequestStream) -> ContentBlocks:
    tools = getattr(parsed, "tools", None)
    return ContentBlocks(answer_parser(parsed, stream) if tools is not None else None, AnswerSplit(stream))


def stop_reason(finish: FinishEvent, blocks: ContentBlocks) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) for the way the worker ended the answer."""
    if finish.finish_reason == "length":
        return "max_tokens", None
    if finish.stop_sequence is not None:
        return "stop_sequence", finish.stop_sequence
    if blocks.has_tool_use:
        return "tool_use", None
    return "end_turn", None


async def respond(request: Request, parsed: ParsedRequest, stream: RequestStream) -> Response:
    """An SSE stream if the client asked for one, else the whole message as one body."""
    if parsed.stream:
        return await _start_stream(request, parsed, stream)
    return await _answer_whole(request, parsed, stream)


async def _collect(parsed: ParsedRequest, stream: RequestStream) -> Response:
    blocks = _content_blocks(parsed, stream)
    while True:
        event = await stream.next_event()
        if isinstance(event, TokenEvent) and event.text:
            blocks.feed(event.text)
        elif isinstance(event, FinishEvent):
            blocks.finish()
            reason, sequence = stop_reason(event, blocks)
            return JSONResponse(message_body(parsed.add.request_id, parsed.model, blocks.content, reason, sequence,
                                             final_usage(event.usage), blocks.extension))
        elif isinstance(event, ErrorEvent):
            raise event.to_error()


async def _answer_whole(request: Request, parsed: ParsedRequest, stream: RequestStream) -> Response:
    """The whole message, unless the client hangs up first (then the request is aborted).
    A long prefill pads the 200's body with whitespace as the OpenAI routes do, so
    clients' read timeouts never fire on a message still being computed; an error after
    that travels in the body in Anthropic's shape."""
    return await answer_whole(request, parsed, stream, _collect, late_error=stream_error_body)


async def _start_stream(request: Request, parsed: ParsedRequest, stream: RequestStream) -> Response:
    """Wait (up to one keep-alive interval) for the worker to take or refuse the prompt, so
    a refusal (a prompt too long: Claude Code compacts on that 400) is an HTTP error and
    `message_start` can carry the prompt's size; then stream."""
    keepalive_s = request.app.state.config.sse_keepalive_s
    first = await stream.next_event(timeout=keepalive_s)
    if isinstance(first, ErrorEvent):
        raise first.to_error()
    return EventStreamResponse(_events(parsed, stream, first, keepalive_s), on_close=stream.abort)


async def _events(parsed: ParsedRequest, stream: RequestStream, first: Message | None,
                  keepalive_s: float) -> AsyncIterator[bytes]:
    """The SSE body; a `ping` and a content keep-alive after every `keepalive_s` of
    silence (a long prefill)."""
    rid = parsed.add.request_id
    blocks = _content_blocks(parsed, stream)
    timer = KeepAliveTimer(keepalive_s)
    prompt = first if isinstance(first, PromptEvent) else None
    start_usage = (usage_body(prompt.prompt_tokens, prompt.cached_tokens, 0, prompt.cache_creation_tokens,
                              prompt.cache_creation_1h_tokens) if prompt else usage_body(0, 0, 0))
    yield sse_event({"type": "message_start", "message": message_body(rid, parsed.model, [], None, None, start_usage)})
    event = None if prompt is not None else first
    try:
        while True:
            if event is None:
                event = await stream.next_event(timeout=timer.remaining())
                if event is None:
                    yield sse_event(PING)
                    for payload in blocks.keepalive():
                        yield sse_event(payload)
                    timer.wrote()
                    continue
            if isinstance(event, TokenEvent) and event.text:
                for payload in blocks.feed(event.text):
                    yield sse_event(payload)
                    timer.wrote()
            elif isinstance(event, FinishEvent):
                for payload in blocks.finish():
                    yield sse_event(payload)
                reason, sequence = stop_reason(event, blocks)
                delta = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                         "usage": final_usage(event.usage)}
                if blocks.extension is not None:
                    delta["mlxd"] = blocks.extension
                yield sse_event(delta)
                yield sse_event({"type": "message_stop"})
                return
            elif isinstance(event, ErrorEvent):
                yield sse_event(stream_error_body(event.to_error()))
                return
            event = None
    except WorkerDead as exc:
        yield sse_event(stream_error_body(exc))
    except Exception as exc:  # headers are sent: the error can only travel in the stream
        logger.exception("stream %s failed", rid)
        yield sse_event(stream_error_body(exc))
