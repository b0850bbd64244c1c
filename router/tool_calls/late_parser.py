"""A tool-call parser made when the answer's first text arrives, not when the answer starts.

A request that waits for its model starts its answer (headers, opening events, keep-alives)
before the model's worker is ready, and the worker says which tool dialect it speaks only
then (`Ready.tool_dialect`, bound into the request by the dialect's `bind`). No text can
arrive before that, so a parser made at its first use always parses in the right dialect.
"""

from __future__ import annotations

from collections.abc import Callable

from router.tool_calls.events import Event
from router.tool_calls.parser import ToolCallParser


class LateParser:
    """A `ToolCallParser` (feed, finish, num_calls) that `make` builds at its first use."""

    def __init__(self, make: Callable[[], ToolCallParser]) -> None:
        self._make = make
        self._parser: ToolCallParser | None = None

    @property
    def num_calls(self) -> int:
        return self._parser.num_calls if self._parser is not None else 0

    def feed(self, text: str) -> list[Event]:
        return self._made().feed(text)

    def finish(self) -> list[Event]:
        return self._made().finish()

    def _made(self) -> ToolCallParser:
        if self._parser is None:
            self._parser = self._make()
        return self._parser
