"""The router's one ZeroMQ ROUTER socket to every child (workers and the kvstore), and
per-request event streams.

A reader task routes each incoming event to the `RequestStream` of its request id and
every other message (hello, ready, pong …) to the handler of the worker that sent it.
Sends go through an outbox drained by one writer task, so any code, even a `finally`
running under cancellation, can send without awaiting. Messages are encoded before they
enter the outbox, so a request the codec cannot carry fails its caller (a 400) and never
reaches the writer; and if either task ever ends unexpectedly it is logged and restarted,
since without them every request would hang.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import zmq
import zmq.asyncio

from protocol.codec import Buffer, decode, encode
from protocol.errors import ProtocolError, RequestError, WorkerDead
from protocol.messages import (
    AbortRequest,
    AddRequest,
    CacheCleared,
    CacheProbed,
    ClearCache,
    CountTokens,
    EmbeddingsEvent,
    EmbedRequest,
    ErrorEvent,
    EventBatch,
    FinishEvent,
    Message,
    PinPrefix,
    PrefixPinned,
    ProbeCache,
    ProgressEvent,
    PromptEvent,
    RerankEvent,
    RerankRequest,
    TokenCount,
    TokenEvent,
)
from protocol.sockets import make_socket

logger = logging.getLogger(__name__)

REQUEST_EVENTS = (PromptEvent, ProgressEvent, TokenEvent, FinishEvent, ErrorEvent, TokenCount, CacheCleared,
                  CacheProbed, PrefixPinned, EmbeddingsEvent, RerankEvent)
TERMINAL_EVENTS = (FinishEvent, ErrorEvent, TokenCount, CacheCleared, CacheProbed, PrefixPinned, EmbeddingsEvent,
                   RerankEvent)
# what opens a RequestStream
StreamRequest = AddRequest | CountTokens | ClearCache | ProbeCache | PinPrefix | EmbedRequest | RerankRequest

PeerHandler = Callable[[Message], None]


class RequestStream:
    """The events of one request, in arrival order, until its terminal event.

    Invariants: after a `FinishEvent`/`ErrorEvent` or a failure the stream is `finished`
    and unregistered, so nothing more is delivered; `WorkerDead` is raised to the reader
    only after every event that arrived before the failure has been read.
    """

    def __init__(self, client: WorkerClient, identity: bytes, request_id: str) -> None:
        self.client = client
        self.identity = identity
        self.request_id = request_id
        self.finished = False
        # what /admin/status shows about it
        self.model = ""
        self.route = ""  # the API route of a generation; empty for the router's own questions
        self.user_agent = ""
        self.created = time.time()
        self.phase = "queued"  # queued -> prefill -> decoding
        self.num_tokens = 0
        self.prompt_tokens: int | None = None  # known once the worker accepted the prompt
        self.cached_tokens = 0
        self.first_token_at: float | None = None  # time.monotonic() of the first token
        self.num_first_tokens = 0  # how many came with it
        self.on_finish: Callable[[FinishEvent], None] | None = None
        self.request: Any = None  # the API request it answers, bound to this worker (router.requests)
        self.on_token: Callable[[str, list[int]], None] | None = None  # each TokenEvent's text and ids
        self._events: collections.deque[Message] = collections.deque()
        self._failure: WorkerDead | None = None
        self._wakeup = asyncio.Event()

    def deliver(self, message: Message) -> None:
        if self.finished:
            return
        if isinstance(message, TokenEvent):
            self.phase = "decoding"
            if message.token_ids and self.first_token_at is None:
                self.first_token_at = time.monotonic()
                self.num_first_tokens = len(message.token_ids)
            self.num_tokens += len(message.token_ids)
            if self.on_token is not None:
                self.on_token(message.text, message.token_ids)
        elif isinstance(message, PromptEvent):
            self.phase = "prefill"
            self.prompt_tokens, self.cached_tokens = message.prompt_tokens, message.cached_tokens
        self._events.append(message)
        if isinstance(message, FinishEvent) and self.on_finish is not None:
            self.on_finish(message)  # bookkeeping of the pool, whatever the dialect answering
        if isinstance(message, TERMINAL_EVENTS):
            self.finished = True
            self.client.forget(self)
        self._wakeup.set()

    def tokens_per_s(self, now: float | None = None) -> float | None:
        """Decode speed so far: the tokens after the first over the time since it came
        (None until a second has passed, so the first tokens do not read as a spike)."""
        if self.first_token_at is None:
            return None
        elapsed = (time.monotonic() if now is None else now) - self.first_token_at
        if elapsed < 1.0:
            return None
        return (self.num_tokens - self.num_first_tokens) / elapsed

    def fail(self, error: WorkerDead) -> None:
        if self.finished:
            return
        self._failure = error
        self.finished = True
        self.client.forget(self)
        self._wakeup.set()

    async def next_event(self, timeout: float | None = None) -> Message | None:
        """The next event; None if `timeout` seconds pass first. Raises `WorkerDead`."""
        while not self._events:
            if self._failure is not None:
                raise self._failure
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout)
            except TimeoutError:
                return None
        return self._events.popleft()

    def abort(self) -> None:
        """Tell the worker to drop this request now, unless it already ended."""
        if self.finished:
            return
        self.finished = True
        self.client.forget(self)
        self.client.post(self.identity, AbortRequest(request_id=self.request_id))


class WorkerClient:
    """Owns the ROUTER socket bound at `address`; workers connect to it as DEALERs.

    Each worker connects with its own identity (`model#generation`), so a restarted
    worker never receives its predecessor's traffic and late messages from a dead
    generation are dropped. Nothing here decides liveness; it records when each peer
    was last heard from (`last_heard`) for the supervisor's ping check.
    """

    def __init__(self, address: str) -> None:
        self.address = address
        self._context: zmq.asyncio.Context | None = None
        self._socket: zmq.asyncio.Socket | None = None
        self._peers: dict[bytes, PeerHandler] = {}
        self._heard: dict[bytes, float] = {}
        self._requests: dict[str, RequestStream] = {}
        self._outbox: asyncio.Queue[tuple[bytes, Message, list[Buffer]]] = asyncio.Queue()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._closing = False
        self.num_task_restarts = 0

    async def start(self) -> None:
        self._context = zmq.asyncio.Context()
        self._socket = make_socket(self._context, zmq.ROUTER, self.address, bind=True)
        # a send to a worker that is not connected fails loudly instead of vanishing
        self._socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._closing = False
        self._start_task("reader", self._read)
        self._start_task("writer", self._write)
        logger.info("listening for workers at %s", self.address)

    def _start_task(self, name: str, work: Callable[[], Awaitable[None]]) -> None:
        task = asyncio.ensure_future(work())
        task.add_done_callback(functools.partial(self._task_ended, name, work))
        self._tasks[name] = task

    def _task_ended(self, name: str, work: Callable[[], Awaitable[None]], task: asyncio.Future[None]) -> None:
        """The reader and writer must outlive every message: restart one that ended."""
        if self._closing or task.cancelled():
            return
        self.num_task_restarts += 1
        logger.error("the %s task for the worker socket ended (%r); restarting it", name, task.exception())
        self._start_task(name, work)

    async def close(self) -> None:
        self._closing = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = {}
        if self._socket is not None:
            self._socket.close(linger=0)
        if self._context is not None:
            self._context.term()
        self._socket = self._context = None

    # ---------------------------------------------------------------- peers

    def add_peer(self, identity: bytes, handler: PeerHandler) -> None:
        """Route `identity`'s non-request messages to `handler` (called on the loop)."""
        self._peers[identity] = handler
        self._heard[identity] = time.monotonic()

    def remove_peer(self, identity: bytes) -> None:
        self._peers.pop(identity, None)
        self._heard.pop(identity, None)

    def last_heard(self, identity: bytes) -> float:
        """time.monotonic() of the last message from `identity` (any kind counts)."""
        return self._heard.get(identity, 0.0)

    def post(self, identity: bytes, message: Message) -> None:
        """Queue `message` for `identity`; never blocks, safe under cancellation. The
        router's own messages always encode; if one did not, it is logged and dropped."""
        try:
            parts = encode(message)
        except Exception:
            logger.exception("could not encode %s for worker %r; not sent", message.type, identity)
            return
        self._outbox.put_nowait((identity, message, parts))

    # ---------------------------------------------------------------- requests

    def open_request(self, identity: bytes, add: StreamRequest) -> RequestStream:
        """Register a stream for `add.request_id`, then send the request to the worker. A
        CountTokens, ClearCache, ProbeCache or PinPrefix is a request too: its one answer
        (a TokenCount, CacheCleared, CacheProbed, PrefixPinned) ends its stream, and a
        worker's death fails it like any other."""
        if add.request_id in self._requests:
            raise ValueError(f"duplicate request id {add.request_id}")
        try:
            parts = encode(add)
        except Exception as exc:  # the validator's checks should make this unreachable
            logger.warning("request %s cannot be encoded: %r", add.request_id, exc)
            raise RequestError(f"the request holds a value that cannot be sent to the model worker ({exc})",
                               status=400) from None
        stream = RequestStream(self, identity, add.request_id)
        self._requests[add.request_id] = stream
        self._outbox.put_nowait((identity, add, parts))
        return stream

    def forget(self, stream: RequestStream) -> None:
        if self._requests.get(stream.request_id) is stream:
            del self._requests[stream.request_id]

    def fail_requests(self, identity: bytes | None, error: WorkerDead, *, abort: bool = False) -> int:
        """End every open request of worker `identity` (None: of all workers) with `error`;
        with `abort`, also tell the (living) worker to drop them. Returns how many."""
        doomed = [s for s in self._requests.values() if identity is None or s.identity == identity]
        for stream in doomed:
            stream.fail(error)
            if abort:
                self.post(stream.identity, AbortRequest(request_id=stream.request_id))
        return len(doomed)

    def open_requests(self) -> list[RequestStream]:
        return list(self._requests.values())

    def num_open_requests(self, identity: bytes | None = None) -> int:
        return sum(1 for s in self._requests.values() if identity is None or s.identity == identity)

    # ---------------------------------------------------------------- tasks

    async def _read(self) -> None:
        assert self._socket is not None
        while True:
            identity, *parts = await self._socket.recv_multipart()
            try:
                message, _frames = decode(parts)
            except ProtocolError as exc:
                logger.warning("dropped a bad message from %r: %s", identity, exc)
                continue
            except Exception:  # msgpack or a message class raising something unforeseen
                logger.exception("dropped an undecodable message from %r", identity)
                continue
            if identity in self._heard:
                self._heard[identity] = time.monotonic()
            for one in message.events if isinstance(message, EventBatch) else (message,):
                try:
                    self._dispatch(identity, one)
                except Exception:  # one bad handler must not stop every worker's traffic
                    logger.exception("failed to handle %s from %r", one.type, identity)

    def _dispatch(self, identity: bytes, message: Message) -> None:
        if isinstance(message, REQUEST_EVENTS):
            stream = self._requests.get(message.request_id)
            if stream is not None and stream.identity == identity:
                stream.deliver(message)
            else:  # normal after an abort or a client disconnect
                logger.debug("%s for finished request %s dropped", message.type, message.request_id)
            return
        handler = self._peers.get(identity)
        if handler is None:
            logger.debug("%s from unknown or retired worker %r dropped", message.type, identity)
            return
        handler(message)

    async def _write(self) -> None:
        assert self._socket is not None
        while True:
            identity, message, parts = await self._outbox.get()
            try:
                await self._socket.send_multipart([identity, *parts])
            except zmq.ZMQError as exc:
                if exc.errno in (zmq.ETERM, zmq.ENOTSOCK):
                    return
                logger.warning("%s to worker %r not delivered: %s", message.type, identity, exc)
                self._undelivered(message, f"the worker is not reachable ({exc}); it may have just died, "
                                           "retry shortly")
            except Exception as exc:  # one message must never end the writer
                logger.exception("%s to worker %r not delivered", message.type, identity)
                self._undelivered(message, f"the request could not be sent to the worker ({exc!r})")

    def _undelivered(self, message: Message, reason: str) -> None:
        if isinstance(message, StreamRequest) and message.request_id in self._requests:
            self._requests[message.request_id].fail(WorkerDead(reason))
