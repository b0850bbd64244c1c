"""How wide a speculative step should be: the width that yields the most expected tokens
per second for the whole batch, or 1 (a plain step) when no width pays.

Why a cost model and not a fixed draft length: on a CPU a forward pass is not free per
position. Measured on Qwen2.5-Coder-0.5B (2 cores, one row): 1, 2, 4, 8 and 16 positions
took 33, 41, 54, 89 and 149 ms, close to `fixed + per_position * positions` (about 26 ms
+ 7.3 ms a position). And a batch's rows share one width: every row computes as many
positions as the widest draft, so one row drafting 8 tokens in a batch of 8 costs the
step 56 extra positions. A draft is worth its width only when the tokens it is expected
to yield outrun what those positions cost.

Expected tokens: a row whose drafts are each accepted with probability `p` (until the
first rejection) yields `1 + p + ... + p^k` tokens from `k` drafts. `p` is estimated per
row from its record (`Acceptance`); the step's cost is fitted online from the wide steps
run so far (`StepCost`), starting from the measured shape above.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# most draft tokens a row verifies in one step. An edit turn's copied runs are long and
# nearly always right, so a wider step spreads the step's fixed cost over more kept
# tokens: on the 1.5B here (55 ms a step + 13.5 ms a position) 32 instead of 16 made
# edit turns 10% faster with the same tokens (48 gave no more)
MOST_DRAFTS = 32


@dataclass
class Acceptance:
    """A row's draft-token acceptance, as the chance that the next draft token is kept:
    kept tokens over kept tokens plus rejections, over a decaying window (a row moves
    between copying its input and writing new text)."""

    # prior p = 0.8: a match of two or more tokens in an agent's context is mostly right,
    # and a row whose first drafts are refused falls below what pays within a step or two
    kept: float = 2.0
    rejected: float = 0.5
    decay: float = 0.8

    def record(self, proposed: int, kept: int) -> None:
        self.kept = self.kept * self.decay + kept
        self.rejected = self.rejected * self.decay + (1 if kept < proposed else 0)

    @property
    def p(self) -> float:
        return self.kept / (self.kept + self.rejected)


def expected_tokens(p: float, drafts: int) -> float:
    """Tokens a row yields from a step with `drafts` draft tokens: its own, plus each
    draft kept while every one before it was."""
    return sum(p ** i for i in range(drafts + 1))


class StepCost:
    """A decode step's time as `fixed + per_position * positions`, least squares over the
    wide steps measured (older ones fading), with a prior of the shape measured on the
    0.5B model so the first decisions are sensible before any step is timed."""

    def __init__(self, fixed_s: float = 0.026, per_position_s: float = 0.0073, decay: float = 0.97) -> None:
        self._decay = decay
        # the prior, as two observations (1 and 16 positions) that fade like the rest
        points = [(x, fixed_s + per_position_s * x) for x in (1.0, 16.0)]
        self._n = float(len(points))
        self._x = sum(x for x, _ in points)
        self._y = sum(y for _, y in points)
        self._xx = sum(x * x for x, _ in points)
        self._xy = sum(x * y for x, y in points)

    def record(self, positions: int, seconds: float) -> None:
        d = self._decay
        self._n = self._n * d + 1.0
        self._x = self._x * d + positions
        self._y = self._y * d + seconds
        self._xx = self._xx * d + positions * positions
        self._xy = self._xy * d + positions * seconds

    def line(self) -> tuple[float, float]:
        """(fixed_s, per_position_s), both kept positive."""
        spread = self._n * self._xx - self._x * self._x
        if spread <= 1e-9:
            return self._y / self._n, 0.0
        slope = (self._n * self._xy - self._x * self._y) / spread
        fixed = (self._y - slope * self._x) / self._n
        # a few noisy steps can tilt the line absurdly: a position costs between 1% of the
        # step's fixed part and all of it (0.5B here: 28%)
        mean = self._y / self._n
        fixed = min(max(fixed, 0.05 * mean), mean)
        slope = min(max(slope, 0.01 * fixed), fixed)
        return fixed, slope

    def seconds(self, positions: int) -> float:
        fixed, slope = self.line()
        return fixed + slope * positions


def best_width(rows: list[tuple[int, float]], cost: StepCost, most: int = MOST_DRAFTS + 1,
               extra: Callable[[int], float] | None = None) -> int:
    """The step width (1 + draft tokens) with the most expected tokens per second for a
    batch whose rows are (drafts available, acceptance p); rows that cannot draft are
    (0, 0.0). 1 when no width beats a plain step. `extra(width)`: what making the drafts
    for that width costs besides verifying them (a draft model's passes)."""
    batch = len(rows)
    widest = min(most, 1 + max((n for n, _ in rows), default=0))
    best, best_rate = 1, batch / cost.seconds(batch)
    for width in range(2, widest + 1):
        tokens = sum(expected_tokens(p, min(n, width - 1)) for n, p in rows)
        rate = tokens / (cost.seconds(batch * width) + (extra(width) if extra is not None else 0.0))
        if rate > best_rate:
            best, best_rate = width, rate
    return best
