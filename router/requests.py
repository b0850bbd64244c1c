"""The two doors into a worker; nothing else in the router opens a request to one.

`stream(request, dialect)`: a generation. Parse -> resolve -> validate -> acquire -> forward;
a dialect (`router.api.*`) contributes only two translations, its body into the internal
request (`ParsedRequest`) and the worker's events back into its wire format. Everything
between is here, in this order, so that a bad body costs nothing: it is refused before any
model is loaded, and a request the model cannot take is refused before it is sent.

`ask(request, model_id, question, answer_type)`: one question with one answer (a token
count, a cache probe, a pin, embeddings, a rerank, a snapshot's one-token prefill). Acquire
-> open -> read until the answer -> abort, and one mapping of what can go wrong: the
worker's ErrorEvent raised as its RequestError, silence past the bound a 503 `worker_busy`,
a dead worker `WorkerDead`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from protocol.errors import ProtocolError, RequestError
from protocol.messages import ErrorEvent, FinishEvent, Message, Ready
from router.call_memory import CallMemory, GeneratedAnswer, mark_history
from router.images import check_model_sees, pull_images, resolved
from router.json_body import parse_json_body
from router.model_settings import speculation, tool_call_grammar, tool_text_recovery
from router.pending_streams import PendingStream
from router.children.pool import WorkerPool
from router.profiles import Profile
from router.children.supervisor import WorkerSupervisor
from router.validation import ParsedRequest, bad, check_against_model
from router.children.worker_client import RequestStream
from router.reasoning_split import markers_of

logger = logging.getLogger(__name__)

Answer = TypeVar("Answer", bound=Message)
CHAT_KINDS = ("chat",)


@dataclass(frozen=True)
class Dialect:
    """What one API adds to the request path: `parse` (its body, and the profile the model
    name selected, into the internal request), `respond` (the events into its answer) and
    optionally `bind` (what only the loaded model decides, from its worker's Ready: the
    chat dialect's tool-call format and the grammar that forces a call)."""

    parse: Callable[[dict[str, Any], Profile | None], ParsedRequest]
    respond: Callable[[Request, ParsedRequest, RequestStream], Awaitable[Response]]
    bind: Callable[[ParsedRequest, Ready], ParsedRequest] | None = None


def model_name(body: dict[str, Any]) -> str:
    """The requested `model`, as the client spelled it (`MODEL`, `MODEL:PROFILE` or an
    alias); the only place a body's model name is read."""
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise bad("model", "'model' is required and must be a string")
    return name


async def stream(request: Request, dialect: Dialect) -> Response:
    """Serve one generation request through `dialect`."""
    pool: WorkerPool = request.app.state.pool
    received = time.monotonic()
    body = parse_json_body(await request.body())
    model_id, profile = pool.resolve(model_name(body))
    request.state.model = model_id  # the `model` label of mlxd_requests_total (router.metrics_route)
    parsed = dialect.parse(body, profile)
    _check_num_messages(parsed, request.app.state.config.max_messages)
    messages, images = pull_images(parsed.add.messages)
    if images:
        parsed.add.messages = messages
        parsed = dataclasses.replace(parsed, images=images)
        config = request.app.state.config
        parsed.add.images = await resolved(parsed.images, max_images=config.max_images,
                                           max_bytes=config.max_image_bytes, allow_urls=config.allow_image_urls)
    request.state.request_id = parsed.add.request_id  # the response's x-request-id (router.middleware.request_id)
    parsed.add.max_output_tokens = pool.config.output_cap_for(model_id, profile)
    settings = pool.config.settings_for(model_id)
    parsed.add.speculation = speculation(settings, profile)
    parsed = _with_tool_switches(parsed, text_recovery=tool_text_recovery(settings, profile),
                                 call_grammar=tool_call_grammar(settings, profile))
    pool.names.check_kind(model_id)
    supervisor = pool.waits.ready_now(model_id)
    if supervisor is not None:
        events = _forward(request, dialect, parsed, model_id, supervisor, received)
    else:  # the answer starts now, with its keep-alives, and the request waits for its model
        events = PendingStream(_forward_when_ready(request, dialect, parsed, model_id, received), parsed)
    try:
        return await dialect.respond(request, parsed, events)
    except BaseException:
        events.abort()  # no answer will read it: free its slot (a no-op once it finished)
        raise


async def ask(request: Request, model_id: str, question: Message, answer_type: type[Answer], *,
              kinds: tuple[str, ...] = CHAT_KINDS, task: str = "completions", load: bool = True,
              timeout_s: float | None = None) -> Answer | None:
    """`question`'s answer from `model_id`'s worker (a model id from `pool.resolve`).

    With `load`, the model is loaded or waited for as a generation would be (its kind
    checked against `kinds` first, a 400 naming `task`); without, a model not ready now is
    not asked and the answer is None (an unpin: nothing to undo in a worker that is not
    there). Events before the answer are skipped (a one-token prefill's deltas)."""
    pool: WorkerPool = request.app.state.pool
    if load:
        supervisor = await pool.acquire(model_id, kinds, task)
    else:
        ready = pool.waits.ready_now(model_id)
        if ready is None:
            return None
        supervisor = ready
    request.state.model = model_id  # the `model` label of mlxd_requests_total (router.metrics_route)
    request.state.request_id = question.request_id  # type: ignore[attr-defined]  # the answer's x-request-id
    events = supervisor.open_request(question)  # type: ignore[arg-type]
    events.model, events.user_agent = model_id, request.headers.get("user-agent", "")
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            event = await events.next_event(timeout=left) if left is None or left > 0 else None
            if event is None:  # only a bounded wait returns None
                raise RequestError(f"the worker of '{model_id}' did not answer within {timeout_s:.0f} s; retry",
                                   status=503, error_type="server_error", code="worker_busy")
            if isinstance(event, ErrorEvent):
                raise event.to_error()
            if isinstance(event, answer_type):
                pool.last_used[model_id] = max(pool.last_used.get(model_id, 0.0), events.created)
                return event
            if isinstance(event, FinishEvent):  # the request ended without the answer asked for
                raise ProtocolError(f"expected {answer_type.__name__} from the worker of '{model_id}', "
                                    "got the end of the request")
    finally:
        events.abort()  # a no-op once answered; frees the worker of a question nobody waits on


async def _forward_when_ready(request: Request, dialect: Dialect, parsed: ParsedRequest, model_id: str,
                              received: float) -> RequestStream:
    supervisor = await request.app.state.pool.acquire(model_id)
    return _forward(request, dialect, parsed, model_id, supervisor, received)


def _forward(request: Request, dialect: Dialect, parsed: ParsedRequest, model_id: str,
             supervisor: WorkerSupervisor, received: float) -> RequestStream:
    """Check the request against the model, bind it to its worker, and send it there."""
    pool: WorkerPool = request.app.state.pool
    pool.last_used[model_id] = time.time()
    if supervisor.ready is not None:
        check_against_model(parsed, supervisor.ready)
        check_model_sees(parsed.images, supervisor.ready, parsed.model)
        if dialect.bind is not None:
            parsed = dialect.bind(parsed, supervisor.ready)
        if parsed.kind != "text":
            parsed = dataclasses.replace(parsed, reasoning=markers_of(supervisor.ready))
    memory: CallMemory | None = getattr(request.app.state, "call_memory", None)
    answer = None
    if memory is not None and parsed.add.messages is not None:
        mark_history(request.app.state, model_id, parsed.add)
        answer = memory.follow(parsed)
    events = supervisor.open_request(parsed.add)
    if answer is not None:
        events.on_token = answer.add
    events.request = parsed
    events.model = model_id
    events.route = request.url.path
    events.user_agent = request.headers.get("user-agent", "")
    events.on_finish = _on_finish(pool, model_id, parsed, getattr(request.state, "api_key_name", None), received,
                                  memory if answer is not None else None, answer)
    return events


def _with_tool_switches(parsed: ParsedRequest, **switches: bool) -> ParsedRequest:
    """The request with its model's (or profile's) switches for its answer's tool calls
    (`ToolRequest` fields); a request without tools has none to switch."""
    tools = getattr(parsed, "tools", None)
    if tools is None or all(getattr(tools, name) == value for name, value in switches.items()):
        return parsed
    switched = dataclasses.replace(tools, **switches)
    return dataclasses.replace(parsed, tools=switched)  # type: ignore[call-arg]  # a ChatRequest's field


def _check_num_messages(parsed: ParsedRequest, max_messages: int) -> None:
    """The 400 for more messages than `max_messages`: counted after the dialect's parse, so
    Anthropic blocks that become several messages and a Responses history count as sent."""
    num = len(parsed.add.messages or ())
    if num > max_messages:
        raise bad("messages", f"the request holds {num} messages, more than the {max_messages} this server "
                  "accepts (max_messages); send a shorter conversation", code="too_many_messages")


def _on_finish(pool: WorkerPool, model_id: str, parsed: ParsedRequest, key_name: str | None, received: float,
               memory: CallMemory | None = None, answer: GeneratedAnswer | None = None
               ) -> Callable[[FinishEvent], None]:
    by = f" (key {key_name})" if key_name is not None else ""  # the key's name, never the key

    def finished(event: FinishEvent) -> None:
        pool.record_finish(model_id, event, time.monotonic() - received)
        if memory is not None and answer is not None and event.finish_reason == "stop" and event.stop_sequence is None:
            memory.remember(model_id, parsed.add.request_id, parsed.tools, parsed.tool_dialect, answer,
                            parsed.reasoning)
        u, t = event.usage, event.timings
        why = f"; {u.misses.describe()}" if u.misses is not None else ""
        logger.info("%s %s%s: %s after %d+%d tokens (%d cached%s), ttft %.2f s, %.1f tok/s",
                    parsed.model, parsed.add.request_id, by, event.finish_reason, u.prompt_tokens,
                    u.completion_tokens, u.cached_tokens, why, t.ttft_s, t.decode_tokens_per_s,
                    extra={"request_id": parsed.add.request_id})  # a field of its own in --log-format json

    return finished
