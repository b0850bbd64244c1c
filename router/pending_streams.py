"""A request whose model is not ready yet, as its answer reads it.

The answer starts at once (its headers, opening events and keep-alives, exactly as through
a long prefill), while the request waits for its model (`router.children.model_waits`); once the
model is ready, the request is checked, bound and sent to the worker, and its events follow.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any

from protocol.errors import RequestError
from protocol.messages import ErrorEvent, Message
from router.children.worker_client import RequestStream


class PendingStream:
    """Reads as a `RequestStream` (`next_event`, `abort`, `request`) before there is one.

    `next_event` returns None at its timeout while the model loads, so the answer sends its
    keep-alives; a request refused on the way (the load failed or took too long, the model
    cannot take the prompt) comes as an ErrorEvent, as a worker's refusal does, so every
    answer already words it in its own shape, before or after its 200 started. `abort`
    (the client went away) stops the wait and leaves the load to run for others.
    """

    def __init__(self, opening: Awaitable[RequestStream], request: Any) -> None:
        self._opening = asyncio.ensure_future(opening)
        self._stream: RequestStream | None = None
        self._refusal: ErrorEvent | None = None
        self._request = request

    @property
    def request(self) -> Any:
        """The request as bound to its worker once it was sent (before: as parsed)."""
        return self._stream.request if self._stream is not None else self._request

    async def next_event(self, timeout: float | None = None) -> Message | None:
        """The next event; None if `timeout` seconds pass first. Raises `WorkerDead`."""
        if self._refusal is not None:
            return self._refusal
        if self._stream is None:
            started = time.monotonic()
            done, _ = await asyncio.wait({self._opening}, timeout=timeout)
            if not done:
                return None
            try:
                self._stream = self._opening.result()
            except RequestError as exc:
                self._refusal = ErrorEvent.from_error(self._request.add.request_id, exc)
                return self._refusal
            if timeout is not None:
                timeout = max(0.0, timeout - (time.monotonic() - started))
        return await self._stream.next_event(timeout)

    def abort(self) -> None:
        """Stop waiting, or drop the request at its worker if it was sent."""
        if not self._opening.done():
            self._opening.cancel()
        elif not self._opening.cancelled() and self._opening.exception() is None:
            self._opening.result().abort()
