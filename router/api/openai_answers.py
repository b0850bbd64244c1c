"""The OpenAI answer to a forwarded request, from the worker's events: one JSON body, or
an SSE stream of chunks. Shared by the chat and text completion dialects.

A client that goes away aborts its request at the worker; a long prefill never times a
client out (SSE comments, or leading whitespace before a JSON body).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from protocol.errors import RequestError, WorkerDead
from protocol.messages import (
    ErrorEvent,
    FinishEvent,
    Message,
    ProgressEvent,
    PromptEvent,
    TokenEvent,
)
from router.api.logprobs import LogprobsFormatter, take_logprobs
from router.api.openai_format import (
    completion_body,
    progress_chunk,
    stream_chunk,
    timings_extension,
    usage_chunk,
)
from router.api.openai_tool_calls import tool_call_answer
from router.reasoning_split import REASONING, AnswerSplit, joined
from router.http_errors import error_body, request_error_body, worker_dead_body
from router.sse import DONE, KEEPALIVE, EventStreamResponse, KeepAliveTimer, sse_data
from router.validation import ParsedRequest
from router.children.worker_client import RequestStream

logger = logging.getLogger(__name__)

# a client that closed its connection gets no answer; 499 is what proxies log for that
CLIENT_CLOSED_REQUEST = 499


async def respond(request: Request, parsed: ParsedRequest, stream: RequestStream) -> Response:
    """An SSE stream if the client asked for one, else the whole answer as one body."""
    if parsed.stream:
        return await _start_event_stream(request, parsed, stream)
    return await answer_whole(request, parsed, stream, _collect)


async def _collect(parsed: ParsedRequest, stream: RequestStream) -> Response:
    texts: list[str] = []
    created = int(time.time())
    logprobs = LogprobsFormatter.for_request(parsed.kind, parsed.add.sampling)
    while True:
        event = await stream.next_event()
        if isinstance(event, TokenEvent):
            texts.append(event.text)
            if logprobs is not None:
                logprobs.add(event.logprobs)
        elif isinstance(event, FinishEvent):
            split = AnswerSplit(stream)
            reasoning, text = joined(split.feed("".join(texts)) + split.finish())
            tools = tool_call_answer(parsed, stream)
            content, tool_calls = tools.message(text) if tools is not None else (text, None)
            reason = tools.finish_reason(event.finish_reason) if tools is not None else event.finish_reason
            return JSONResponse(completion_body(parsed.kind, parsed.add.request_id, parsed.model, created,
                                                content, reason, event.usage, event.timings, tool_calls,
                                                take_logprobs(logprobs),
                                                tool_report=tools.report if tools is not None else None,
                                                reasoning=reasoning or None))
        elif isinstance(event, ErrorEvent):
            raise event.to_error()


async def wait_for_disconnect(request: Request) -> None:
    """Return when the client hangs up (every dialect's whole-body answer races this)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def openai_late_error(exc: RequestError | WorkerDead) -> dict[str, Any]:
    """OpenAI's error body for an error that comes after a padded 200 has started."""
    return request_error_body(exc) if isinstance(exc, RequestError) else worker_dead_body(exc)


async def answer_whole(request: Request, parsed: ParsedRequest, stream: RequestStream,
                       collect: Callable[[ParsedRequest, RequestStream], Awaitable[Response]],
                       late_error: Callable[[RequestError | WorkerDead], dict[str, Any]] = openai_late_error
                       ) -> Response:
    """The whole answer `collect` builds from the events, unless the client hangs up
    first (then abort). Every dialect that answers in one JSON body shares this.

    An answer not ready within one keep-alive interval (a long prefill) is sent as a
    200 whose body starts with whitespace, one space per interval, then the JSON: that
    keeps clients' read timeouts from firing, and JSON parsers skip leading whitespace.
    Errors that come later travel in that body, in the shape `late_error` gives (the
    route's API's error body).
    """
    task = asyncio.ensure_future(collect(parsed, stream))
    gone = asyncio.ensure_future(wait_for_disconnect(request))
    keepalive_s = request.app.state.config.sse_keepalive_s
    try:
        await asyncio.wait({task, gone}, timeout=keepalive_s, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        gone.cancel()
        raise
    if task.done():
        gone.cancel()
        return task.result()  # raises RequestError / WorkerDead for the exception handlers
    if gone.done():
        task.cancel()
        stream.abort()
        logger.info("client went away; request %s aborted", parsed.add.request_id)
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    gone.cancel()  # the streaming response watches for disconnects from here on
    return EventStreamResponse(_padded_body(task, keepalive_s, late_error), on_close=lambda: _cancel(task, stream),
                               media_type="application/json")


def _cancel(task: asyncio.Future, stream: RequestStream) -> None:
    task.cancel()
    stream.abort()


async def _padded_body(collect: asyncio.Future, keepalive_s: float,
                       late_error: Callable[[RequestError | WorkerDead], dict[str, Any]]) -> AsyncIterator[bytes]:
    # committed to padding once the first interval passed: the body starts with a space
    # even when the answer comes right after (else its form would depend on a race)
    yield b" "
    while not collect.done():
        await asyncio.wait({collect}, timeout=keepalive_s)
        if not collect.done():
            yield b" "
    try:
        response = collect.result()
    except (RequestError, WorkerDead) as exc:
        yield json.dumps(late_error(exc)).encode()
        return
    yield bytes(response.body)


async def _start_event_stream(request: Request, parsed: ParsedRequest, stream: RequestStream) -> Response:
    """Wait (up to one keep-alive interval) for the worker to accept or refuse the prompt,
    so a refusal (e.g. prompt too long) still gets a proper HTTP status; then stream."""
    keepalive_s = request.app.state.config.sse_keepalive_s
    try:
        first = await stream.next_event(timeout=keepalive_s)
    except BaseException:
        stream.abort()
        raise
    if isinstance(first, ErrorEvent):
        raise first.to_error()
    return EventStreamResponse(_events(parsed, stream, first, keepalive_s), on_close=stream.abort)


def _deltas(pieces: list[tuple[str, str]], tools: Any) -> list[dict[str, Any]]:
    """The chunk deltas of split text: reasoning as itself, the answer through the
    tool-call parser when the request offers tools."""
    deltas: list[dict[str, Any]] = []
    for kind, text in pieces:
        if kind == REASONING:
            deltas.append({"reasoning": text})
        else:
            deltas.extend(tools.feed(text) if tools is not None else [{"text": text}])
    return deltas


async def _events(parsed: ParsedRequest, stream: RequestStream, first: Message | None,
                  keepalive_s: float) -> AsyncIterator[bytes]:
    """The SSE body: role chunk, content chunks, finish chunk, [usage chunk], [DONE]."""
    rid, model, kind, created = parsed.add.request_id, parsed.model, parsed.kind, int(time.time())
    include_usage = parsed.include_usage
    tools = tool_call_answer(parsed, stream)  # None: the text goes out as it comes
    split = AnswerSplit(stream)  # the reasoning span goes out as reasoning_content
    logprobs = LogprobsFormatter.for_request(kind, parsed.add.sampling)  # None: not asked for
    timer = KeepAliveTimer(keepalive_s)
    if kind == "chat":
        yield sse_data(stream_chunk(kind, rid, model, created, role="assistant", text="",
                                    include_usage=include_usage))
        timer.wrote()
    event = first
    try:
        while True:
            if event is None:
                event = await stream.next_event(timeout=timer.remaining())
                if event is None:
                    yield KEEPALIVE
                    timer.wrote()
                    continue
            if isinstance(event, TokenEvent) and logprobs is not None:
                logprobs.add(event.logprobs)  # sent with the next chunk that has text, or the last
            if isinstance(event, TokenEvent) and event.text:
                for delta in _deltas(split.feed(event.text), tools):
                    yield sse_data(stream_chunk(kind, rid, model, created, include_usage=include_usage,
                                                logprobs=take_logprobs(logprobs), **delta))
                    timer.wrote()
            elif isinstance(event, FinishEvent):
                reason = event.finish_reason
                for delta in _deltas(split.finish(), tools):
                    yield sse_data(stream_chunk(kind, rid, model, created, include_usage=include_usage, **delta))
                if tools is not None:
                    for delta in tools.finish():
                        yield sse_data(stream_chunk(kind, rid, model, created, include_usage=include_usage, **delta))
                    reason = tools.finish_reason(reason)
                last = stream_chunk(kind, rid, model, created, text=None if kind == "chat" else "",
                                    finish_reason=reason, include_usage=include_usage,
                                    logprobs=take_logprobs(logprobs))
                last["mlxd"] = timings_extension(event.timings, event.usage,
                                                 tools.report if tools is not None else None)
                yield sse_data(last)
                if include_usage:
                    yield sse_data(usage_chunk(kind, rid, model, created, event.usage))
                yield DONE
                return
            elif isinstance(event, ErrorEvent):
                yield sse_data(request_error_body(event.to_error()))
                return
            elif isinstance(event, ProgressEvent):
                yield sse_data(progress_chunk(kind, rid, model, created, event.processed_tokens, event.total_tokens))
                timer.wrote()
            elif not isinstance(event, (TokenEvent, PromptEvent)):
                logger.debug("%s on stream %s ignored", event.type, rid)
            event = None
    except WorkerDead as exc:
        yield sse_data(worker_dead_body(exc))
    except Exception as exc:  # headers are sent: the error can only travel in the stream
        logger.exception("stream %s failed", rid)
        yield sse_data(error_body(f"internal server error ({type(exc).__name__}); see the mlxd log", "server_error"))
