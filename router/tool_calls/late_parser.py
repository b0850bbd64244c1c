"""A tool-call parser made when the answer's first text arrives, not when the answer starts.

A request that waits for its model starts its answer (headers, opening events, keep-alives)
before the model's worker is ready, and the worker says which tool dialect it speaks only
then (`Ready.tool_dialect`, bound into the request by the dialect's `bind`). No text can
arrive before that, so a parser made at its first use always parses in the right dialect.

Every API answers through one, so it is also where an answer's calls meet the request's
last results: at `finish` it says what the response's `mlxd.tool_calls` reports.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from router.tool_calls.events import Event
from router.tool_calls.parser import ToolCallParser
from router.tool_calls.repeats import AnsweredCall, repeated_calls


class LateParser:
    """A `ToolCallParser` (feed, finish, num_calls) that `make` builds at its first use;
    `answered`: the calls whose results end the request (`repeats.last_results`), `label`
    the request id, for the log."""

    def __init__(self, make: Callable[[], ToolCallParser], answered: Sequence[AnsweredCall] = (),
                 label: str = "") -> None:
        self._make = make
        self._parser: ToolCallParser | None = None
        self._answered = answered
        self._label = label
        self.report: dict[str, Any] | None = None  # set by `finish`

    @property
    def num_calls(self) -> int:
        return self._parser.num_calls if self._parser is not None else 0

    def feed(self, text: str) -> list[Event]:
        return self._made().feed(text)

    def finish(self) -> list[Event]:
        """The held events; and the report: calls read from text, calls that repeat one
        whose result the request brought (each logged)."""
        parser = self._made()
        events = parser.finish()
        self.report = {"recovered_from_text": parser.num_recovered,
                       "repeated": repeated_calls(parser.calls, self._answered, self._label)}
        return events

    def _made(self) -> ToolCallParser:
        if self._parser is None:
            self._parser = self._make()
        return self._parser
