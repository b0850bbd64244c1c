"""Chat-template rendering, tokenizing and the SSD read-ahead, on a background thread; and
the requests answered without generating (token counts, cache probes, writing a
snapshot's blocks to SSD), which need no more than that thread and the kvstore.

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
from dataclasses import dataclass, field
from typing import Any

from protocol.errors import RequestError
from protocol.messages import AddRequest, CountTokens, ErrorEvent, Message, TokenCount
from worker.cache_breakpoints import BreakpointPosition


@dataclass
class PreparedPrompt:
    """A prompt ready for admission: its token ids, what was read ahead for it, and its
    output constraint compiled (compiling may take long for a large grammar)."""

    prompt_ids: list[int]
    read_ahead: Any = None  # the prefix cache's ColdRun, or None
    matcher: Any = None  # the request's compiled grammar (an llguidance matcher), or None
    divergence: Any = None  # where it left an earlier prompt, message found (`worker.message_at_token`), or None
    breakpoints: list[BreakpointPosition] = field(default_factory=list)  # its cache breakpoints, as token positions


Prepare = Callable[[AddRequest], PreparedPrompt]
Count = Callable[[CountTokens], int]


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

    def __init__(self, prepare: Prepare, threaded: bool = True, count: Count | None = None) -> None:
        """`threaded=False` prepares inside `submit` (tests of the loop's logic); `count`
        answers token counts (`submit_count`)."""
        self._prepare = prepare
        self._count = count
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tokenizer") if threaded else None
        self._pending: dict[str, tuple[AddRequest, float, concurrent.futures.Future[PreparedPrompt]]] = {}
        # request id -> (what is done, as an error message says it; its answer to come)
        self._counts: dict[str, tuple[str, concurrent.futures.Future[Message]]] = {}

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    @property
    def num_counting(self) -> int:
        """Counts and other answers submitted and not yet taken (they are not requests: no
        slot, no queue)."""
        return len(self._counts)

    def _run(self, work: Callable[[Any], Any], argument: Any) -> concurrent.futures.Future[Any]:
        if self._executor is not None:
            return self._executor.submit(work, argument)
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            future.set_result(work(argument))
        except Exception as exc:
            future.set_exception(exc)
        return future

    def submit(self, request: AddRequest) -> None:
        arrived = time.perf_counter()
        self._pending[request.request_id] = (request, arrived, self._run(self._prepare, request))

    def submit_count(self, request: CountTokens) -> None:
        """Count `request`'s prompt on the thread, after the prompts submitted before it.
        The engine loop only hands it over and sends the answer (`take_counted`), so a burst
        of counts never waits behind a generation, which may run for minutes."""
        if self._count is None:
            raise RuntimeError("this preparer was made without a count function")
        count = self._count
        self.submit_answer(request.request_id, lambda: TokenCount(request.request_id, count(request)),
                           "count this prompt")

    def submit_answer(self, request_id: str, work: Callable[[], Message], what: str) -> None:
        """Run `work` on the thread, after what was submitted before it; the message it
        returns is `request_id`'s answer (`take_counted`), and what it raises an ErrorEvent
        (`what` says in the message what could not be done)."""
        self._counts[request_id] = (what, self._run(lambda _: work(), None))

    def take_counted(self) -> list[Message]:
        """The answers of the counts (and other submitted answers) that ended, in any
        order (each is for its own id)."""
        answers: list[Message] = []
        for request_id, (what, future) in list(self._counts.items()):
            if not future.done():
                continue
            del self._counts[request_id]
            error = future.exception()
            if error is None:
                answers.append(future.result())
                continue
            if not isinstance(error, RequestError):
                error = RequestError(f"the worker could not {what} ({type(error).__name__}: {error})",
                                     status=500, error_type="server_error")
            answers.append(ErrorEvent.from_error(request_id, error))
        return answers

    def cancel(self, request_id: str) -> bool:
        """Drop a request or count still being prepared; False if it is not here (any more)."""
        count = self._counts.pop(request_id, None)
        if count is not None:
            count[1].cancel()
            return True
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
