"""Withhold text that might become a stop string, so a stop never reaches the client.

A stop string can be split across tokens ("Par" + "is"); text that ends with a proper
prefix of some stop string is held back until the next delta settles it.
"""

from __future__ import annotations


class StopStringFilter:
    """Per-request filter over the stream of text deltas.

    Invariant: everything returned so far, plus `held`, is the text generated so far,
    with no stop string fully inside the returned part.
    """

    def __init__(self, stops: list[str]) -> None:
        self._stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that set `stopped`

    def push(self, delta: str) -> str:
        """Text safe to send now; sets `stopped` when a stop string completed."""
        if not self._stops:
            return delta
        text = self._held + delta
        first = min(
            ((i, s) for s in self._stops if (i := text.find(s)) >= 0),
            default=None,
        )
        if first is not None:
            self._held = ""
            self.stopped = True
            self.matched = first[1]
            return text[: first[0]]
        keep = self._longest_stop_prefix_suffix(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """The held-back tail, released when generation ended for another reason."""
        held, self._held = self._held, ""
        return held

    def _longest_stop_prefix_suffix(self, text: str) -> int:
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best
