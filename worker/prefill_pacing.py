"""How many prompt tokens a step may prefill, so that a step stays short on a slow machine."""

from __future__ import annotations


class PrefillPacer:
    """Sizes each step's prefill chunk from the prefill speed this worker measures.

    Why: a step is one uninterrupted MLX computation. While it runs, every decoding
    stream waits for its next token and the router's pings go unanswered. A fixed chunk
    of `max_chunk` tokens is a fraction of a second for a small model on a fast machine,
    but a 1.5B model prefilling two 512-token chunks on a 2-core CPU under load took
    62 s: the router killed the worker as hung, failing every request on it. Steps are
    kept near `target_s` instead: the chunk is the measured rate times `target_s`,
    shared among the prompts prefilling together, never above `max_chunk` (the
    configured `prefill_chunk_tokens`) nor below `min_chunk`. Until a step has been
    measured the chunk is `first_chunk`, small: pacing from the configured chunk let
    that very first step run 62 s again (512 tokens of the 1.5B beside a decode, on a
    loaded machine). A fast machine loses one short step to it.
    """

    def __init__(self, max_chunk: int, target_s: float = 4.0, min_chunk: int = 32, first_chunk: int = 64) -> None:
        self.max_chunk = max_chunk
        self.min_chunk = min(min_chunk, max_chunk)
        self.first_chunk = min(first_chunk, max_chunk)
        self.target_s = target_s
        self.tokens_per_s: float | None = None  # prefill speed, smoothed over steps
        self._done: dict[int, int] = {}  # uid -> prompt tokens prefilled so far

    def chunk_tokens(self, num_prefilling: int) -> int:
        """The chunk for the next step, for each of `num_prefilling` prompts."""
        if self.tokens_per_s is None:
            return self.first_chunk
        budget = self.tokens_per_s * self.target_s / max(1, num_prefilling)
        return int(min(self.max_chunk, max(self.min_chunk, budget)))

    def record(self, progress: list[tuple[int, int, int]], seconds: float) -> None:
        """A step ran for `seconds` and moved these prompts to `(uid, done, total)`.

        The rate counts the step's decode work as prefill time, so it errs towards
        shorter steps. Steps that prefilled little say little about the rate and are
        not counted.
        """
        tokens = 0
        for uid, done, total in progress:
            tokens += max(0, done - self._done.get(uid, 0))
            if done >= total:
                self._done.pop(uid, None)
            else:
                self._done[uid] = done
        if tokens < self.min_chunk or seconds <= 0:
            return
        rate = tokens / seconds
        self.tokens_per_s = rate if self.tokens_per_s is None else 0.5 * self.tokens_per_s + 0.5 * rate

    def forget(self, uid: int) -> None:
        """`uid` left before its prompt was done (aborted, failed)."""
        self._done.pop(uid, None)
