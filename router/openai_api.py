"""OpenAI-compatible route handlers: /v1/models, /v1/chat/completions, /v1/completions, /health.

A handler validates, hands the request to the model's worker, and turns the worker's
event stream into either one JSON body or an SSE stream. A client that goes away
aborts its request at the worker.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from protocol.errors import RequestError, WorkerDead
from protocol.messages import ErrorEvent, FinishEvent, Message, ProgressEvent, PromptEvent, TokenEvent
from router.http_errors import error_body, request_error_body, worker_dead_body
from router.openai_format import (
    completion_body,
    model_card,
    progress_chunk,
    stream_chunk,
    timings_extension,
    usage_chunk,
)
from router.pool import WorkerPool
from router.sse import DONE, KEEPALIVE, EventStreamResponse, KeepAliveTimer, sse_data
from router.validation import (
    ParsedRequest,
    check_against_model,
    parse_chat_request,
    parse_completion_request,
    parse_json_body,
)
from router.web_guard import holds_key, states_only
from router.worker_client import RequestStream

logger = logging.getLogger(__name__)

# a client that closed its connection gets no answer; 499 is what proxies log for that
CLIENT_CLOSED_REQUEST = 499


def _pool(request: Request) -> WorkerPool:
    return request.app.state.pool


def _error_from_event(event: ErrorEvent) -> RequestError:
    return RequestError(event.message, status=event.status, error_type=event.error_type,
                        param=event.param, code=event.code)


def _log_finish(parsed: ParsedRequest, stream: RequestStream, event: FinishEvent) -> None:
    if stream.on_finish is not None:
        stream.on_finish(event)
    u, t = event.usage, event.timings
    logger.info("%s %s: %s after %d+%d tokens (%d cached), ttft %.2f s, %.1f tok/s",
                parsed.model, parsed.add.request_id, event.finish_reason, u.prompt_tokens,
                u.completion_tokens, u.cached_tokens, t.ttft_s, t.decode_tokens_per_s)


# ---------------------------------------------------------------- models and health


async def health(request: Request) -> Response:
    """200 when every worker is ready, else 503 with the same body (status "degraded").

    Open to probes without the API key, but then only states: pids, paths and error text
    tell an outsider about the machine and are for whoever holds the key."""
    pool = _pool(request)
    body = pool.health()
    if not holds_key(request.headers, request.app.state.config.api_key):
        body = states_only(body)
    return JSONResponse(body, status_code=200 if pool.is_healthy() else 503)


def _card(pool: WorkerPool, name: str) -> dict[str, Any]:
    model_id, profile = pool.resolve(name)
    supervisor = pool.supervisors.get(model_id)
    extra: dict[str, Any] = {"kind": pool.registry[model_id].kind, "state": pool.state_of(model_id),
                             "pinned": model_id in pool.pinned}
    if profile is not None:
        extra["profile_of"] = model_id
    if supervisor is not None and supervisor.ready is not None:
        extra["context_length"] = supervisor.ready.context_length
    return model_card(name, pool.created, **extra)


async def list_models(request: Request) -> Response:
    pool = _pool(request)
    profiles = sorted(pool.config.profiles)
    names = [*pool.models, *(p for p in profiles if p not in pool.registry)]
    return JSONResponse({"object": "list", "data": [_card(pool, m) for m in names]})


async def get_model(request: Request) -> Response:
    return JSONResponse(_card(_pool(request), request.path_params["model_id"]))


# ---------------------------------------------------------------- completions


async def chat_completions(request: Request) -> Response:
    return await _complete(request, parse_chat_request)


async def completions(request: Request) -> Response:
    return await _complete(request, parse_completion_request)


async def _complete(request: Request, parse: Callable[[dict[str, Any]], ParsedRequest]) -> Response:
    # parse, resolve and validate before anything expensive: a bad body never loads a model
    body = parse_json_body(await request.body())
    name = body.get("model")
    if not isinstance(name, str) or not name:
        parse(body)  # raises the 400 naming `model`
    _, profile = _pool(request).resolve(name)
    parsed = parse(body, profile) if profile is not None else parse(body)
    supervisor, _ = await _pool(request).acquire(name)
    if supervisor.ready is not None:
        check_against_model(parsed, supervisor.ready)
    stream = supervisor.open_request(parsed.add)
    stream.model = supervisor.model_id
    stream.user_agent = request.headers.get("user-agent", "")
    stream.on_finish = functools.partial(_pool(request).record_finish, supervisor.model_id)
    if parsed.stream:
        return await _start_event_stream(request, parsed, stream)
    try:
        return await _answer_whole(request, parsed, stream)
    except BaseException:
        stream.abort()
        raise


async def _collect(parsed: ParsedRequest, stream: RequestStream) -> Response:
    texts: list[str] = []
    created = int(time.time())
    while True:
        event = await stream.next_event()
        if isinstance(event, TokenEvent):
            texts.append(event.text)
        elif isinstance(event, FinishEvent):
            _log_finish(parsed, stream, event)
            return JSONResponse(completion_body(parsed.kind, parsed.add.request_id, parsed.model, created,
                                                "".join(texts), event.finish_reason, event.usage,
                                                event.timings))
        elif isinstance(event, ErrorEvent):
            raise _error_from_event(event)


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _answer_whole(request: Request, parsed: ParsedRequest, stream: RequestStream) -> Response:
    """Collect the whole answer, unless the client hangs up first (then abort).

    An answer not ready within one keep-alive interval (a long prefill) is sent as a
    200 whose body starts with whitespace, one space per interval, then the JSON: that
    keeps clients' read timeouts from firing, and JSON parsers skip leading whitespace.
    Errors that come later travel in that body in OpenAI's error shape.
    """
    collect = asyncio.ensure_future(_collect(parsed, stream))
    gone = asyncio.ensure_future(_wait_for_disconnect(request))
    keepalive_s = request.app.state.config.sse_keepalive_s
    try:
        await asyncio.wait({collect, gone}, timeout=keepalive_s, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        collect.cancel()
        gone.cancel()
        raise
    if collect.done():
        gone.cancel()
        return collect.result()  # raises RequestError / WorkerDead for the exception handlers
    if gone.done():
        collect.cancel()
        stream.abort()
        logger.info("client went away; request %s aborted", parsed.add.request_id)
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    gone.cancel()  # the streaming response watches for disconnects from here on
    return EventStreamResponse(_padded_body(collect, keepalive_s), on_close=lambda: _cancel(collect, stream),
                               media_type="application/json")


def _cancel(task: asyncio.Future, stream: RequestStream) -> None:
    task.cancel()
    stream.abort()


async def _padded_body(collect: asyncio.Future, keepalive_s: float) -> AsyncIterator[bytes]:
    while True:
        done, _ = await asyncio.wait({collect}, timeout=keepalive_s)
        if done:
            break
        yield b" "
    try:
        response = collect.result()
    except RequestError as exc:
        yield json.dumps(request_error_body(exc)).encode()
        return
    except WorkerDead as exc:
        yield json.dumps(worker_dead_body(exc)).encode()
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
        raise _error_from_event(first)
    return EventStreamResponse(_events(parsed, stream, first, keepalive_s), on_close=stream.abort)


async def _events(parsed: ParsedRequest, stream: RequestStream, first: Message | None,
                  keepalive_s: float) -> AsyncIterator[bytes]:
    """The SSE body: role chunk, content chunks, finish chunk, [usage chunk], [DONE]."""
    rid, model, kind, created = parsed.add.request_id, parsed.model, parsed.kind, int(time.time())
    include_usage = parsed.include_usage
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
            if isinstance(event, TokenEvent) and event.text:
                yield sse_data(stream_chunk(kind, rid, model, created, text=event.text, include_usage=include_usage))
                timer.wrote()
            elif isinstance(event, FinishEvent):
                _log_finish(parsed, stream, event)
                last = stream_chunk(kind, rid, model, created, text=None if kind == "chat" else "",
                                    finish_reason=event.finish_reason, include_usage=include_usage)
                last["mlxd"] = timings_extension(event.timings, event.usage)
                yield sse_data(last)
                if include_usage:
                    yield sse_data(usage_chunk(kind, rid, model, created, event.usage))
                yield DONE
                return
            elif isinstance(event, ErrorEvent):
                yield sse_data(request_error_body(_error_from_event(event)))
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
