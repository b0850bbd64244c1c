"""The worker's socket to the router: `protocol.child.ParentChannel`, plus holding what
one engine step sends so that it goes out as one `EventBatch`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from protocol.child import ParentChannel
from protocol.messages import EventBatch, Message


class RouterChannel(ParentChannel):
    """Sends never block the engine (see `ParentChannel`); inside `batched()` they are held
    and leave as one message, however many streams a step advanced."""

    _held: list[Message] | None = None

    def send(self, message: Message) -> None:
        if self._held is not None:
            self._held.append(message)
            return
        super().send(message)

    @contextlib.contextmanager
    def batched(self) -> Iterator[None]:
        """Hold what is sent inside the block and send it as one `EventBatch` at its end."""
        self._held = []
        try:
            yield
        finally:
            self.flush()
            self._held = None

    def flush(self) -> None:
        """Inside `batched`: send what is held now, as one message, and go on holding."""
        held = self._held
        if not held:
            return
        self._held = None  # so that send() sends
        self.send(held[0] if len(held) == 1 else EventBatch(held))
        self._held = []
