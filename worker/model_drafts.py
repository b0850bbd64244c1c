"""The draft model's part of a speculative decode step: catch each row's draft KV up with
the tokens the target took without it, draft a few tokens greedily, and after the target
has verified them give back the draft positions it refused.

Why the draft lags: a plain step runs the target alone (worker/drafted_model.py), so a step
that does not pay for drafting costs nothing extra, and the draft takes the tokens it
missed in one wide pass the next time it drafts (a pass over a few positions costs about
one over a single position, worker/draft_planner.py). A row whose lag is longer than
`catch_up` takes that many and drafts nothing this step.

Drafts are the draft's argmax: a proposal certain given its context, so the same
verification keeps them for greedy rows (kept while they equal the target's argmax) and
for sampled ones (the rejection rule with a one-token proposal,
`speculative_batch.judge_sampled`) and every token stays the target's own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from worker.draft_planner import StepCost
from worker.drafted_model import DraftedModel

CATCH_UP = 48  # most positions one row feeds the draft in a step's first draft pass


@dataclass
class _Round:
    """What one step's drafting fed each row: the draft's positions after the tokens that
    were real (its lag, then the pending token), and whether the pending token was among
    them (only then do its drafts follow from it)."""

    after_real: np.ndarray
    drafted: np.ndarray  # bool: the row's drafts continue its pending token
    passes: int  # draft passes after the first


def drafter_for(model: Any) -> ModelDrafter | None:
    """The drafter of a model served with a draft model, else None."""
    return ModelDrafter(model) if isinstance(model, DraftedModel) else None


class ModelDrafter:
    """Drafts from the draft model for the rows of one batch (`SpeculativeBatch`)."""

    def __init__(self, drafted: DraftedModel, catch_up: int = CATCH_UP) -> None:
        self.drafted = drafted
        self.catch_up = catch_up
        self.cost = StepCost()  # one draft pass, by the positions it feeds
        self._round: _Round | None = None

    def lags(self, cache: list[Any]) -> np.ndarray:
        """Per row, tokens the target holds that the draft does not."""
        target, draft = self.drafted.split(cache)
        return target[0].lengths - draft[0].lengths

    def seconds(self, rows: int, width: int, first_positions: int) -> float:
        """What drafting `width - 1` tokens for a batch of `rows` is expected to cost, its
        first pass feeding `first_positions` positions a row (0 for a plain step)."""
        if width <= 1:
            return 0.0
        return self.cost.seconds(rows * first_positions) + (width - 2) * self.cost.seconds(rows)

    def draft(self, cache: list[Any], tokens: list[list[int]], pending: list[int], wanted: list[int]) -> list[list[int]]:
        """Each row's drafts after its pending token: `wanted[r]` of them (rows wanting
        none still catch up, so their lag does not grow). Leaves the draft's positions
        for `settle` to cut back once the target has judged them."""
        _, draft_cache = self.drafted.split(cache)
        lags = self.lags(cache)
        before = draft_cache[0].lengths.copy()
        feeds, drafted = [], []
        for row, lag in enumerate(lags.tolist()):
            behind = tokens[row][len(tokens[row]) - lag:] if lag else []
            fits = lag < self.catch_up
            feeds.append(behind + [pending[row]] if fits else behind[:self.catch_up])
            drafted.append(fits and wanted[row] > 0)
        width = max(len(f) for f in feeds)
        inputs = mx.array([f + [f[-1]] * (width - len(f)) for f in feeds], dtype=mx.uint32)
        started = time.perf_counter()
        logits = self.drafted.draft_logits(inputs, cache)
        last = mx.array([len(f) - 1 for f in feeds], dtype=mx.int32)
        token = mx.argmax(logits[mx.arange(len(feeds)), last], axis=-1)
        mx.eval(token)
        self.cost.record(len(feeds) * width, time.perf_counter() - started)
        after_real = before + np.array([len(f) for f in feeds], dtype=np.int64)
        for layer in draft_cache:  # the padding past each row's feed goes
            layer.truncate(after_real)
        passes = max((w for w, d in zip(wanted, drafted) if d), default=0) - 1
        proposed = [token]
        started = time.perf_counter()
        for _ in range(max(0, passes)):
            logits = self.drafted.draft_logits(proposed[-1][:, None].astype(mx.uint32), cache)
            proposed.append(mx.argmax(logits[:, -1], axis=-1))
        columns = mx.stack(proposed, axis=1)
        mx.eval(columns)
        if passes > 0:
            self.cost.record(len(feeds), (time.perf_counter() - started) / passes)
        self._round = _Round(after_real, np.array(drafted, dtype=bool), max(0, passes))
        rows = columns.tolist()
        return [rows[r][:wanted[r]] if drafted[r] else [] for r in range(len(feeds))]

    def settle(self, cache: list[Any], kept: list[int]) -> None:
        """After the target kept `kept[r]` of row r's drafts: the draft keeps its real
        positions and the kept drafts it was fed (the last draft never was)."""
        if self._round is None:
            return
        r, self._round = self._round, None
        kept_fed = np.minimum(np.array(kept, dtype=np.int64), r.passes)
        lengths = r.after_real + np.where(r.drafted, kept_fed, 0)
        for layer in self.drafted.split(cache)[1]:
            layer.truncate(lengths)
