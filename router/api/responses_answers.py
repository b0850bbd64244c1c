"""The Responses API's answer to a forwarded request: the worker's events into a Response
object (one JSON body) or its stream of typed events (`response.created` ...
`response.completed`), and the finished conversation into the response store.

Both modes build their output items with one `OutputAssembler`, fed from one tool-call
parser, so a streamed answer and a whole one cannot disagree.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from protocol.errors import RequestError, WorkerDead
from protocol.messages import ErrorEvent, FinishEvent, TokenEvent, Usage
from router.api.openai_answers import answer_whole
from router.api.openai_tool_calls import ChatRequest, answer_parser
from router.api.response_store import ResponseStore, StoredResponse
from router.reasoning_split import ANSWER, REASONING, AnswerSplit
from router.sse import EventStreamResponse, KeepAliveTimer, sse_event
from router.tool_calls import ArgumentsDelta, CallEnd, CallStart, Event, TextDelta, ToolCallParser
from router.tool_calls.late_parser import LateParser
from router.validation import ParsedRequest
from router.children.worker_client import RequestStream

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResponsesRequest(ChatRequest):
    """A chat request (tools and all) with what a Response object adds: its id, the
    conversation to store (the inputs without `instructions`, previous turns included),
    whether to store it, which namespace each namespaced function came from (a call to
    one names it), and the request parameters a Response repeats back (`echo`)."""

    response_id: str = ""
    conversation: tuple[dict[str, Any], ...] = ()
    store: bool = True
    namespaces: Mapping[str, str] = field(default_factory=dict)
    echo: Mapping[str, Any] = field(default_factory=dict)


def usage_body(usage: Usage) -> dict[str, Any]:
    """The Responses usage object (not chat's `prompt_tokens` names)."""
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputAssembler:
    """One answer's output items, built from its text as it arrives, and the stream
    events that announce them.

    Invariants: at most one item is open, always the last; text opens a `message` item
    (with one `output_text` part) unless one is open, a call closes it and is a
    `function_call` item of its own; every event carries the next `sequence_number`
    from 0; a finished answer has at least one item (an empty message if need be), so
    clients that read the first message's text always find one.
    """

    def __init__(self, parsed: ResponsesRequest, parser: ToolCallParser | LateParser | None,
                 split: AnswerSplit | None = None) -> None:
        self._parsed = parsed
        self._parser = parser  # None: no tools, all text is message text
        self._split = split  # None: nothing is reasoning
        self._open_reasoning: list[str] | None = None  # the open reasoning item's text pieces
        self.created_at = int(time.time())
        self.items: list[dict[str, Any]] = []
        self._open_text: list[str] | None = None  # the open message's text pieces
        self._sequence = 0

    # --- the Response object
    def response(self, status: str, usage: Usage | None = None, incomplete_reason: str | None = None,
                 error: dict[str, Any] | None = None) -> dict[str, Any]:
        """The Response object as it stands (`status` in_progress, completed, incomplete
        or failed)."""
        parsed = self._parsed
        return {
            "id": parsed.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": error,
            "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
            "model": parsed.model,
            "output": [dict(item) for item in self.items] if status != "in_progress" else [],
            "usage": usage_body(usage) if usage is not None else None,
            **parsed.echo,
            **({"mlxd": self.extension} if status != "in_progress" and self.extension is not None else {}),
        }

    @property
    def extension(self) -> dict[str, Any] | None:
        """The finished answer's `mlxd` block: `tool_calls` (calls read from text, repeats)
        when the request offered tools; None otherwise. SDKs keep unknown keys."""
        report = self._parser.report if isinstance(self._parser, LateParser) else None
        return {"tool_calls": report} if report is not None else None

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    # --- the stream
    def start(self) -> list[dict[str, Any]]:
        """What a stream opens with, before the worker has said anything."""
        response = self.response("in_progress")
        return [self._event("response.created", response=response),
                self._event("response.in_progress", response=response)]

    def keepalive(self) -> dict[str, Any]:
        """A real event for a silent stretch (a long prefill): `response.in_progress` again.
        Codex's stream idle timeout (300 s) counts parsed events, and SSE comments are not
        events to its parser, so a comment would not keep it waiting."""
        return self._event("response.in_progress", response=self.response("in_progress"))

    def feed(self, text: str) -> list[dict[str, Any]]:
        """The events the next piece of the answer settles."""
        return self._pieces(self._split.feed(text) if self._split is not None else [(ANSWER, text)])

    def _pieces(self, pieces: list[tuple[str, str]]) -> list[dict[str, Any]]:
        """Reasoning into a `reasoning` item; the answer through the tool-call parser."""
        events: list[dict[str, Any]] = []
        for kind, text in pieces:
            if kind == REASONING:
                events += self._reasoning(text)
            else:
                events += self._close_reasoning()
                events += self._apply(self._parser.feed(text) if self._parser is not None else [TextDelta(text)])
        return events

    def _reasoning(self, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._open_reasoning is None:
            item = {"type": "reasoning", "id": _new_id("rs"), "summary": [], "status": "in_progress"}
            self.items.append(item)
            self._open_reasoning = []
            events.append(self._event("response.output_item.added", output_index=len(self.items) - 1,
                                      item=dict(item)))
        self._open_reasoning.append(text)
        events.append(self._event("response.reasoning_text.delta", **self._text_place(), delta=text))
        return events

    def _close_reasoning(self, status: str = "completed") -> list[dict[str, Any]]:
        if self._open_reasoning is None:
            return []
        text, self._open_reasoning = "".join(self._open_reasoning), None
        item = self.items[-1]
        item.update(status=status, content=[{"type": "reasoning_text", "text": text}])
        return [self._event("response.reasoning_text.done", **self._text_place(), text=text),
                self._event("response.output_item.done", output_index=len(self.items) - 1, item=dict(item))]

    def finish(self, finish: FinishEvent) -> list[dict[str, Any]]:
        """The events that close the answer, the last one `response.completed` (or
        `response.incomplete` when the answer was cut at its token limit)."""
        events = self._pieces(self._split.finish()) if self._split is not None else []
        events += self._apply(self._parser.finish()) if self._parser is not None else []
        cut = finish.finish_reason == "length"
        events += self._close_reasoning("incomplete" if cut else "completed")
        if not any(item["type"] != "reasoning" for item in self.items):
            events += self._open_message()
        events += self._close_message("incomplete" if cut else "completed")
        if cut:
            final = self.response("incomplete", finish.usage, incomplete_reason="max_output_tokens")
            return events + [self._event("response.incomplete", response=final)]
        return events + [self._event("response.completed", response=self.response("completed", finish.usage))]

    def fail(self, error: dict[str, Any]) -> list[dict[str, Any]]:
        """The event that ends a stream whose request failed after it began; `error` is
        the OpenAI error object (message, type, param, code)."""
        if self._open_text is not None:  # no more events for it: the final output shows it cut short
            text, self._open_text = "".join(self._open_text), None
            self.items[-1].update(status="incomplete", content=[{"type": "output_text", "text": text,
                                                                   "annotations": []}])
        failure = {"code": error.get("code") or "server_error", "message": error.get("message") or ""}
        return [self._event("response.failed", response=self.response("failed", error=failure))]

    def _apply(self, parsed_events: list[Event]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for parsed in parsed_events:
            if isinstance(parsed, TextDelta):
                if self._open_text is None:
                    events += self._open_message()
                assert self._open_text is not None
                self._open_text.append(parsed.text)
                events.append(self._event("response.output_text.delta", **self._text_place(), delta=parsed.text,
                                          logprobs=[]))
            elif isinstance(parsed, CallStart):
                events += self._close_message("completed")
                events += self._open_call(parsed)
            elif isinstance(parsed, ArgumentsDelta):
                item = self.items[-1]
                item["arguments"] += parsed.fragment
                events.append(self._event("response.function_call_arguments.delta", item_id=item["id"],
                                          output_index=len(self.items) - 1, delta=parsed.fragment))
            elif isinstance(parsed, CallEnd):
                events += self._close_call()
        return events

    def _text_place(self) -> dict[str, Any]:
        return {"item_id": self.items[-1]["id"], "output_index": len(self.items) - 1, "content_index": 0}

    def _open_message(self) -> list[dict[str, Any]]:
        item = {"type": "message", "id": _new_id("msg"), "role": "assistant", "status": "in_progress", "content": []}
        self.items.append(item)
        self._open_text = []
        part = {"type": "output_text", "text": "", "annotations": []}
        return [self._event("response.output_item.added", output_index=len(self.items) - 1, item=dict(item)),
                self._event("response.content_part.added", **self._text_place(), part=part)]

    def _close_message(self, status: str) -> list[dict[str, Any]]:
        if self._open_text is None:
            return []
        text, self._open_text = "".join(self._open_text), None
        part = {"type": "output_text", "text": text, "annotations": []}
        item = self.items[-1]
        item.update(status=status, content=[part])
        return [self._event("response.output_text.done", **self._text_place(), text=text, logprobs=[]),
                self._event("response.content_part.done", **self._text_place(), part=part),
                self._event("response.output_item.done", output_index=len(self.items) - 1, item=dict(item))]

    def _open_call(self, start: CallStart) -> list[dict[str, Any]]:
        item: dict[str, Any] = {"type": "function_call", "id": _new_id("fc"), "call_id": start.id,
                                "name": start.name, "arguments": "", "status": "in_progress"}
        namespace = self._parsed.namespaces.get(start.name)
        if namespace is not None:
            item["namespace"] = namespace
        self.items.append(item)
        return [self._event("response.output_item.added", output_index=len(self.items) - 1, item=dict(item))]

    def _close_call(self) -> list[dict[str, Any]]:
        item = self.items[-1]
        item["status"] = "completed"
        index = len(self.items) - 1
        return [self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                            arguments=item["arguments"]),
                self._event("response.output_item.done", output_index=index, item=dict(item))]

    # --- the store
    def answer_messages(self) -> list[dict[str, Any]]:
        """The answer as chat-template messages: one assistant message with its text and
        calls, as the next turn's history renders it."""
        texts = [part["text"] for item in self.items if item["type"] == "message" for part in item["content"]]
        reasoning = [part["text"] for item in self.items if item["type"] == "reasoning"
                     for part in item.get("content") or []]
        calls = [{"id": item["call_id"], "type": "function",
                  "function": {"name": item["name"], "arguments": item["arguments"]}}
                 for item in self.items if item["type"] == "function_call"]
        message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
        if reasoning:  # the template decides whether a past turn's reasoning is shown again
            message["reasoning_content"] = "".join(reasoning)
        if calls:
            message["tool_calls"] = calls
        return [message]


def _assembler(parsed: ParsedRequest, stream: RequestStream) -> OutputAssembler:
    assert isinstance(parsed, ResponsesRequest)
    return OutputAssembler(parsed, answer_parser(parsed, stream) if parsed.tools else None, AnswerSplit(stream))


def _remember(store: ResponseStore, parsed: ResponsesRequest, answer: OutputAssembler) -> None:
    if parsed.store:
        messages = (*parsed.conversation, *answer.answer_messages())
        store.put(StoredResponse(parsed.response_id, parsed.model, messages))


async def respond(request: Request, parsed: ParsedRequest, stream: RequestStream, *,
                  store: ResponseStore) -> Response:
    """A stream of Responses events if the client asked for one, else the Response."""
    assert isinstance(parsed, ResponsesRequest)
    if parsed.stream:
        keepalive_s = request.app.state.config.sse_keepalive_s
        return EventStreamResponse(_events(parsed, stream, store, keepalive_s), on_close=stream.abort)
    return await answer_whole(request, parsed, stream, partial(_collect, store=store))


async def _collect(parsed: ParsedRequest, stream: RequestStream, *, store: ResponseStore) -> Response:
    assert isinstance(parsed, ResponsesRequest)
    answer = _assembler(parsed, stream)
    while True:
        event = await stream.next_event()
        if isinstance(event, TokenEvent) and event.text:
            answer.feed(event.text)
        elif isinstance(event, FinishEvent):
            final = answer.finish(event)[-1]["response"]
            _remember(store, parsed, answer)
            return JSONResponse(final)
        elif isinstance(event, ErrorEvent):
            raise event.to_error()


def _failed(answer: OutputAssembler, error: dict[str, Any]) -> bytes:
    return b"".join(sse_event(event) for event in answer.fail(error))


async def _events(parsed: ResponsesRequest, stream: RequestStream, store: ResponseStore,
                  keepalive_s: float) -> AsyncIterator[bytes]:
    """The SSE body. `response.created` goes out at once, before the prefill (a client
    shows the turn has started); `response.in_progress` again while the worker is silent."""
    answer = _assembler(parsed, stream)
    timer = KeepAliveTimer(keepalive_s)
    for event in answer.start():
        yield sse_event(event)
    timer.wrote()
    try:
        while True:
            message = await stream.next_event(timeout=timer.remaining())
            if message is None:
                yield sse_event(answer.keepalive())
                timer.wrote()
            elif isinstance(message, TokenEvent) and message.text:
                for event in answer.feed(message.text):
                    yield sse_event(event)
                    timer.wrote()
            elif isinstance(message, FinishEvent):
                for event in answer.finish(message):
                    yield sse_event(event)
                _remember(store, parsed, answer)
                return
            elif isinstance(message, ErrorEvent):
                error = message.to_error()
                yield _failed(answer, {"code": error.code, "message": error.message})
                return
    except WorkerDead as exc:
        yield _failed(answer, {"code": "server_error", "message": str(exc)})
    except RequestError as exc:
        yield _failed(answer, {"code": exc.code, "message": exc.message})
    except Exception as exc:  # headers are sent: the failure can only travel in the stream
        logger.exception("stream %s failed", parsed.response_id)
        message = f"internal server error ({type(exc).__name__}); see the mlxd log"
        yield _failed(answer, {"code": "server_error", "message": message})
