"""The Responses API's memory of past answers: what `previous_response_id` continues.

Only responses created with `store: true` (the API's default) are kept, in the router's
memory and for as long as the router runs: a client that needs more (Codex) sends
`store: false` and replays the whole conversation each turn, which the prefix cache
serves just as well.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

# a conversation holds text, not KV: a few hundred of them cost megabytes at most
DEFAULT_CAPACITY = 256


@dataclass(frozen=True)
class StoredResponse:
    """One finished response: its conversation in chat-template form (the inputs it was
    answered from, previous turns included, then its own answer), without its
    `instructions`, which OpenAI does not carry over to the next response."""

    response_id: str
    model: str
    messages: tuple[dict[str, Any], ...]


class ResponseStore:
    """Response id -> `StoredResponse`, least recently used first out.

    Invariant: at most `capacity` responses; reading one (`get`) makes it the most
    recently used, so a conversation that is still going on is never the one dropped.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._responses: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._responses)

    def get(self, response_id: str) -> StoredResponse | None:
        stored = self._responses.get(response_id)
        if stored is not None:
            self._responses.move_to_end(response_id)
        return stored

    def put(self, stored: StoredResponse) -> None:
        self._responses[stored.response_id] = stored
        self._responses.move_to_end(stored.response_id)
        while len(self._responses) > self.capacity:
            dropped, _ = self._responses.popitem(last=False)
            logger.debug("response store full (%d): forgot %s", self.capacity, dropped)
