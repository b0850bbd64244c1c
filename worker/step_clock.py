"""Where a worker's steps spend their host time, as counters since it started.

Why: a constrained batch was measurably slower than a free one while the matcher's own
time per token was small; only the split of a whole step (inside the generator, waiting
for the step before so a grammar can read its tokens, computing masks, and handing the
tokens out afterwards) says where the rest goes. The counters ride on the pongs, so
/metrics and a benchmark read them without touching the engine loop.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StepClock:
    steps: int = 0  # BatchGenerator steps (prefill chunks and decode steps alike)
    rows: int = 0  # sequences decoding, summed over steps: rows / steps is the mean batch
    generate_s: float = 0.0  # inside BatchGenerator.next(): building and running the step
    step_s: float = 0.0  # the whole step: the generator, then tokens handed out and caches captured

    def record(self, rows: int, began: float, generated: float, ended: float) -> None:
        """One step that started at `began`, left the generator at `generated` and ended
        at `ended` (perf_counter seconds)."""
        self.steps += 1
        self.rows += rows
        self.generate_s += generated - began
        self.step_s += ended - began

    def stats(self, grammar_wait_s: float, grammar_mask_s: float) -> dict[str, int | float]:
        """The pong's counters; the grammar's two figures are the GrammarBatch's (inside
        `generate_s`)."""
        return {"steps": self.steps, "step_rows": self.rows, "step_generate_seconds": round(self.generate_s, 6),
                "step_seconds": round(self.step_s, 6), "grammar_wait_seconds": round(grammar_wait_s, 6),
                "grammar_mask_seconds": round(grammar_mask_s, 6)}
