"""Chat-template rendering, tokenizing and the SSD read-ahead, on a background thread.

Tokenizing a prompt of a few hundred kilobytes takes most of a second, megabytes take
seconds, and reading its cached blocks from SSD waits on another process; done on the
engine loop, either would freeze every running stream for as long. HF tokenizers release
the GIL while they encode, and so does waiting on a socket, so on a thread the loop keeps
stepping.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from protocol.messages import AddRequest


@dataclass
class PreparedPrompt:
    """A prompt ready for admission: its token ids, what was read ahead for it, and its
    output constraint compiled (compiling may take long for a large grammar)."""

    prompt_ids: list[int]
    read_ahead: Any = None  # the prefix cache's ColdRun, or None
    matcher: Any = None  # the request's compiled grammar (an llguidance matcher), or None


Prepare = Callable[[AddRequest], PreparedPrompt]


@dataclass
class Prepared:
    """A request whose prompt is ready (`prompt`) or failed to be (`error`)."""

    request: AddRequest
    arrived: float  # time.perf_counter() when it reached the worker
    prompt: PreparedPrompt | None = None
    error: BaseException | None = None


class PromptPreparer:
    """Runs `prepare` for each submitted request on one thread, in arrival order.

    Invariant: every submitted request comes out of `take_done` exactly once, unless it is
    cancelled first (its client went away); `num_pending` counts those still in flight.
    """

    def __init__(self, prepare: Prepare, threaded: bool = True) -> None:
        """`threaded=False` prepares inside `submit` (tests of the loop's logic)."""
        self._prepare = prepare
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tokenizer") if threaded else None
        self._pending: dict[str, tuple[AddRequest, float, concurrent.futures.Future[PreparedPrompt]]] = {}

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def submit(self, request: AddRequest) -> None:
        arrived = time.perf_counter()
        if self._executor is not None:
            future = self._executor.submit(self._prepare, request)
        else:
            future = concurrent.futures.Future()
            try:
                future.set_result(self._prepare(request))
            except Exception as exc:
                future.set_exception(exc)
        self._pending[request.request_id] = (request, arrived, future)

    def cancel(self, request_id: str) -> bool:
        """Drop a request still being prepared; False if it is not here (any more)."""
        entry = self._pending.pop(request_id, None)
        if entry is None:
            return False
        entry[2].cancel()  # a running one finishes on the thread; its result is dropped
        return True

    def take_done(self) -> list[Prepared]:
        """The requests whose preparation ended, in arrival order."""
        done = []
        for request_id, (request, arrived, future) in list(self._pending.items()):
            if not future.done():
                break  # one thread: later ones cannot have finished first
            del self._pending[request_id]
            error = future.exception()
            done.append(Prepared(request, arrived, None if error else future.result(), error))
        return done

    def wait(self, timeout_s: float) -> None:
        """Block until every pending request is prepared, or `timeout_s` passes."""
        if self._pending:
            concurrent.futures.wait([future for _, _, future in self._pending.values()], timeout=timeout_s)

    def take_all(self) -> list[AddRequest]:
        """Every pending request, prepared or not (shutdown: they are failed)."""
        requests = []
        for request, _, future in self._pending.values():
            future.cancel()
            requests.append(request)
        self._pending.clear()
        return requests

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
