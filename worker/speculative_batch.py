"""The running batch's decode steps with speculation: a step may feed a row its new
token and a few drafted ones, verify them all in one forward pass, and keep the drafts
the model itself would have produced.

Why in the batch: decode on a CPU reads every weight once per step whatever the rows, so
W positions of a row cost little more than one; verifying drafts turns that spare room
into tokens. Rows without drafts (no match, sampled, logits processors) share the same
step and take only its first position, so speculation never splits the batch.

Exactness (greedy rows): the verify pass gives each position the bits a plain step would
(mlxd's kernels compute each row from its own inputs, worker/cpu_kernels.py), a draft is
kept only while it equals the argmax at the position before it, and the row's KV gives
back the rejected positions (worker/ragged_kv_cache.py). So the tokens, their logprobs
and the cache are what plain decoding produces, only sooner.

A row drafts from prompt lookup when its text repeats, and otherwise, when the model has
a draft model (worker/drafted_model.py) and the row may use it, from the draft model
(worker/model_drafts.py), whose passes the planner counts into the step's cost.

When nothing can be drafted the step is mlx-lm's own (pipelined: the next step is
dispatched before this one's tokens are read). A row's draft is looked for first from
the tokens already read; only when some row has one is the pending token read and the
wide step built, so free text that never matches keeps the plain step's overlap.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.generate import GenerationBatch
from mlx_lm.models.cache import BatchKVCache

from worker.draft_planner import MOST_DRAFTS, Acceptance, StepCost, best_width
from worker.model_drafts import ModelDrafter
from worker.prompt_lookup import DraftLength, PromptLookup
from worker.ragged_kv_cache import RaggedKVCache
from worker.sampling import RequestSampler, greedy


@dataclass
class RowDrafts:
    """One sequence's draft source and its record (`length` is the request's own, so its
    proposed and accepted counts outlive the row)."""

    lookup: PromptLookup
    length: DraftLength = field(default_factory=DraftLength)
    acceptance: Acceptance = field(default_factory=Acceptance)
    use_model: bool = False  # may draft from the draft model when the lookup finds nothing
    model_acceptance: Acceptance = field(default_factory=Acceptance)

    def record(self, from_model: bool, proposed: int, kept: int) -> None:
        self.length.record(proposed, kept)
        (self.model_acceptance if from_model else self.acceptance).record(proposed, kept)


class SpeculativeBatch(GenerationBatch):
    """mlx-lm's generation batch whose step verifies drafts (see the module docstring).

    `held(uid)` is the grammar processor that masks the row of `uid`, if any: masked at a
    wide step's first position only, such a row drafts only as far as its `free_ahead`
    says no mask is needed (a lazy call grammar before its trigger), and its grammar
    consumes the drafts it keeps."""

    def __init__(self, *args: Any, eos_token_ids: list[int] = (), max_draft: int = MOST_DRAFTS,
                 held: Callable[[int], Any] = lambda uid: None, drafter: ModelDrafter | None = None,
                 **kwargs: Any) -> None:
        self._drafts: dict[int, RowDrafts] = {}
        self._wanted: dict[int, tuple[DraftLength, bool]] = {}
        self.drafter = drafter
        self._plain_at: tuple[float, int] | None = None  # when the last plain step began, and its rows
        self._plain_gaps: deque[float] = deque(maxlen=5)
        self._was_plain = True
        self._eos = frozenset(int(t) for t in eos_token_ids)
        self._max_draft = max_draft
        self._held = held
        self.cost = StepCost()
        self._reported: list[list[int]] = []
        self._reported_logprobs: list[list[mx.array]] = []
        super().__init__(*args, **kwargs)

    @classmethod
    def replacing(cls, batch: GenerationBatch, **options: Any) -> SpeculativeBatch:
        """An empty speculative batch in place of mlx-lm's empty `batch`."""
        if len(batch):
            raise ValueError("only an empty generation batch can be replaced")
        return cls(batch.model, [], mx.array([], dtype=mx.uint32), [], [], [], batch.fallback_sampler, [], [], [],
                   **options)

    # ------------------------------------------------------------ who speculates

    def want(self, uid: int, length: DraftLength, use_model: bool = False) -> None:
        """`uid` (inserted, maybe not decoding yet) drafts when it can, `length` long;
        `use_model`: from the draft model too, where the batch has one."""
        self._wanted[uid] = (length, use_model and self.drafter is not None)

    def extend(self, batch: GenerationBatch) -> None:
        super().extend(batch)
        self.prompt_cache = [RaggedKVCache.from_batch(c) if isinstance(c, BatchKVCache) else c
                             for c in self.prompt_cache]
        for uid, tokens in zip(batch.uids, batch.tokens):
            if uid in self._wanted:
                length, use_model = self._wanted[uid]
                self._drafts[uid] = RowDrafts(PromptLookup(tokens), length, use_model=use_model)

    def filter(self, keep: list[int]) -> None:
        gone = set(self.uids) - {self.uids[i] for i in keep}
        super().filter(keep)
        for uid in gone:
            self._drafts.pop(uid, None)
            self._wanted.pop(uid, None)

    # ------------------------------------------------------------ the step

    def _draftable(self, row: int) -> RowDrafts | None:
        drafts = self._drafts.get(self.uids[row])
        if drafts is None or (self.logits_processors and self.logits_processors[row]):
            return None
        sampler = (self.samplers[row] if self.samplers else None) or self.fallback_sampler
        return drafts if sampler is greedy or isinstance(sampler, RequestSampler) else None

    def _room(self, row: int) -> int:
        """Drafts row `row` may still take: the step reports them all plus its token."""
        return max(0, min(self._max_draft, self.max_tokens[row] - self._num_tokens[row] - 1))

    def _plan(self) -> Plan | None:
        """The rows to draft for and how, or None for a plain step: judged before the
        pending token is read, from each row's lookup as the tokens already read predict
        it, or from the draft model's record where the lookup finds nothing
        (`worker/draft_planner.py` weighs it, the draft model's passes included)."""
        if not all(isinstance(c, RaggedKVCache) for c in self.prompt_cache):
            return None
        planned, rows = {}, []
        for row in range(len(self.uids)):
            drafts = self._draftable(row)
            limit = min(drafts.length.length, self._room(row)) if drafts else 0
            seen = 0
            if limit > 0:
                drafts.lookup.extend(self.tokens[row][len(drafts.lookup):])
                predicted = drafts.lookup.propose(limit + 1)  # the pending token, then drafts
                grammar = self._held(self.uids[row])
                seen = (len(predicted) if grammar is None else grammar.free_ahead(predicted)) - 1
            if seen > 0:
                planned[row] = (drafts, limit, False)
                rows.append((seen, drafts.acceptance.p))
            elif limit > 0 and drafts.use_model:
                planned[row] = (drafts, limit, True)
                rows.append((limit, drafts.model_acceptance.p))
            else:
                rows.append((0, 0.0))
        if not planned:
            return None
        extra = None
        if any(from_model for _, _, from_model in planned.values()):
            first = 1 + int(min(self.drafter.lags(self.prompt_cache).max(), self.drafter.catch_up))
            extra = lambda width: self.drafter.seconds(len(rows), width, first)  # noqa: E731
        width = best_width(rows, self.cost, extra=extra)
        return Plan(planned, width) if width > 1 else None

    def _step(self) -> tuple[list[int], list[mx.array]]:
        if self.drafter is None:
            return self._either_step()
        began = time.perf_counter()
        if self._plain_at is not None and self._plain_at[1] == len(self.uids):
            # a target-only step, timed from one to the next (pipelined: this is its
            # compute): the cost the draft model's passes must beat. The least of the last
            # few, as a prefill chunk between two steps lengthens the gap without them
            self._plain_gaps.append(began - self._plain_at[0])
            if len(self._plain_gaps) >= 3:
                self.cost.record(len(self.uids), min(self._plain_gaps))
        else:
            self._plain_gaps.clear()
        with self.drafter.drafted.target_only():
            tokens, logprobs = self._either_step()
        self._plain_at = (began, len(self.uids)) if self._was_plain else None
        return tokens, logprobs

    def _either_step(self) -> tuple[list[int], list[mx.array]]:
        plan = self._plan()
        self._was_plain = plan is None
        if plan is None:
            tokens, logprobs = super()._step()
            self._reported = [[t] for t in tokens]
            self._reported_logprobs = [[lp] for lp in logprobs]
            return tokens, logprobs
        return self._wide_step(plan)

    def _proposals(self, pending: list[int], plan: Plan) -> list[list[int]]:
        """Each row's drafts now that its pending token is known, cut to the width that
        pays best."""
        planned = plan.rows
        modelled = None
        if any(from_model for _, _, from_model in planned.values()):
            wanted = [min(planned[r][1], plan.width - 1) if r in planned and planned[r][2] and t not in self._eos
                      else 0 for r, t in enumerate(pending)]
            modelled = self.drafter.draft(self.prompt_cache, self.tokens, pending, wanted) if any(wanted) else None
        proposals: list[list[int]] = []
        for row, token in enumerate(pending):
            proposal: list[int] = []
            if row in planned and token not in self._eos:  # nothing is drafted past an answer's end
                drafts, limit, from_model = planned[row]
                drafts.lookup.extend([token])
                made = (modelled[row] if modelled else []) if from_model else drafts.lookup.propose(limit)
                proposal = _cut_at(made, self._eos)
                grammar = self._held(self.uids[row])
                if grammar is not None:  # only as far as no draft needs a mask
                    proposal = proposal[:max(0, grammar.free_ahead([token] + proposal) - 1)]
            proposals.append(proposal)
        rows = [(len(p), _acceptance(planned[row])) if p else (0, 0.0) for row, p in enumerate(proposals)]
        width = best_width(rows, self.cost)  # the draft passes are spent: only the verification counts
        return [p[:width - 1] for p in proposals]

    def _wide_step(self, plan: Plan) -> tuple[list[int], list[mx.array]]:
        """Feed each row its pending token and its drafts, keep what the model agrees with."""
        current = self._next_tokens
        mx.eval(current, self._next_logprobs)
        pending = current.tolist()
        proposals = self._proposals(pending, plan)
        planned = plan.rows
        started = time.perf_counter()
        width = 1 + max(len(p) for p in proposals)
        rows = [[t] + p + [t] * (width - 1 - len(p)) for t, p in zip(pending, proposals)]
        logits = self._processed(current, self.model(mx.array(rows, dtype=mx.uint32), cache=self.prompt_cache))
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        best = mx.argmax(logprobs, axis=-1)
        mx.eval(best, logprobs)
        best_rows = best.tolist()
        self.cost.record(len(rows) * width, time.perf_counter() - started)
        sampled, next_logprobs, rejected, kept = [], [], [], []
        self._reported, self._reported_logprobs = [], []
        for row, (token, proposal) in enumerate(zip(pending, proposals)):
            sampler = (self.samplers[row] if self.samplers else None) or self.fallback_sampler
            if sampler is greedy:
                accepted = kept_drafts(proposal, best_rows[row])
                sampled.append(best[row, accepted:accepted + 1])
            elif proposal and isinstance(sampler, RequestSampler):
                accepted, drawn = judge_sampled(sampler, logprobs[row], proposal)
                sampled.append(drawn)
            else:  # drafts nothing: its token comes from the first position, as in a plain step
                accepted = 0
                sampled.append(sampler(logprobs[row, :1]))
            if proposal:
                drafts, _, from_model = planned[row]
                drafts.record(from_model, len(proposal), accepted)
            kept.append(accepted)
            fed = [token] + proposal[:accepted]
            grammar = self._held(self.uids[row]) if accepted else None
            if grammar is not None:  # it consumed the pending token in the forward pass; now the kept drafts
                grammar.consume(proposal[:accepted])
            self._reported.append(fed)
            self._reported_logprobs.append([self._next_logprobs[row]] + [logprobs[row, i] for i in range(accepted)])
            self.tokens[row].extend(fed)
            rejected.append(width - len(fed))
            next_logprobs.append(logprobs[row, accepted])
        if self.drafter is None:
            for cache in self.prompt_cache:
                cache.rollback(rejected)
        else:
            for cache in self.drafter.drafted.split(self.prompt_cache)[0]:
                cache.rollback(rejected)
            self.drafter.settle(self.prompt_cache, kept)
        self._current_tokens = current
        self._current_logprobs = self._next_logprobs
        self._next_tokens = mx.concatenate(sampled).astype(current.dtype)
        self._next_logprobs = next_logprobs
        mx.async_eval(self._next_tokens, self._next_logprobs)
        return pending, self._current_logprobs

    def _processed(self, current: mx.array, logits: mx.array) -> mx.array:
        """`logits` (B, W, V) with each row's logits processors (logit_bias, penalties)
        applied to its first position, as a plain step applies them; such a row drafts
        nothing, so its other positions are never read."""
        if not any(self.logits_processors):
            return logits
        rows = []
        for e, processors in enumerate(self.logits_processors):
            if not processors:
                rows.append(logits[e])
                continue
            first = logits[e, :1]
            context = self._token_context[e].update_and_fetch(current[e:e + 1])
            for processor in processors:
                first = processor(context, first)
            rows.append(mx.concatenate([first, logits[e, 1:]]))
        return mx.stack(rows)

    def next(self) -> list[GenerationBatch.Response]:
        """Every token each row got this step, in order; a row's last response carries its
        finish (mlx-lm's `next`, for several tokens a row)."""
        if not self.uids:
            return []
        self._step()
        keep, responses = [], []
        for i in range(len(self.uids)):
            finish_reason = None
            tokens, logprobs = self._reported[i], self._reported_logprobs[i]
            for token, logprob in zip(tokens, logprobs):
                self._num_tokens[i] += 1
                if self._num_tokens[i] >= self.max_tokens[i]:
                    finish_reason = "length"
                if self._matchers[i].advance(token):
                    finish_reason = "stop"
                responses.append(self.Response(
                    uid=self.uids[i], token=token, logprobs=logprob, finish_reason=finish_reason,
                    prompt_cache=self.extract_cache(i) if finish_reason is not None else None,
                    all_tokens=self.tokens[i] if finish_reason is not None else None))
                if finish_reason is not None:
                    break
            if finish_reason is None:
                keep.append(i)
        if len(keep) < len(self.uids):
            self.filter(keep)
        return responses


@dataclass
class Plan:
    """A wide step's rows (row -> (its drafts, most tokens, drafted by the model)) and
    the width the planner chose before any draft was made."""

    rows: dict[int, tuple[RowDrafts, int, bool]]
    width: int


def _acceptance(planned: tuple[RowDrafts, int, bool]) -> float:
    drafts, _, from_model = planned
    return (drafts.model_acceptance if from_model else drafts.acceptance).p


def kept_drafts(proposal: list[int], best: list[int]) -> int:
    """How many of a row's drafts are kept: each while it is the token the model puts
    first at the position before it (`best[i]` follows the row's input at position i)."""
    kept = 0
    while kept < len(proposal) and proposal[kept] == best[kept]:
        kept += 1
    return kept


def judge_sampled(sampler: RequestSampler, logprobs: mx.array, proposal: list[int]) -> tuple[int, mx.array]:
    """Speculative sampling for a row drawn at temperature > 0, whose drafts are certain
    (prompt lookup proposes one token, with probability 1): draft `i` is kept with the
    probability the row's own distribution gives it at the position before; at the first
    one refused, the token is drawn from that distribution without it; when all are kept,
    from the distribution after the last. The rejection rule with a one-token proposal, so
    every token follows the distribution a plain step draws from (Leviathan et al. 2023).
    Returns (drafts kept, the drawn token as a 1-element array)."""
    k = len(proposal)
    scaled = sampler.scaled(logprobs[:k + 1])  # (k + 1, V): what a plain step draws from, per position
    drafted = mx.array(proposal, dtype=mx.int32)
    chance = mx.softmax(scaled[:k], axis=-1)[mx.arange(k), drafted]
    draws = mx.random.uniform(shape=(k,), key=sampler.next_key())
    kept_each = (draws < chance).tolist()
    kept = next((i for i, ok in enumerate(kept_each) if not ok), k)
    if kept < k:  # refused: draw from the rest of that position's distribution
        others = mx.where(mx.arange(scaled.shape[-1]) == proposal[kept], -mx.inf, scaled[kept])
        return kept, mx.random.categorical(others, key=sampler.next_key()).reshape(1)
    return kept, mx.random.categorical(scaled[k], key=sampler.next_key()).reshape(1)


def _cut_at(proposal: list[int], stops: frozenset[int]) -> list[int]:
    """The proposal up to and including its first stop token: nothing is drafted past
    the end of an answer."""
    for i, token in enumerate(proposal):
        if token in stops:
            return proposal[:i + 1]
    return proposal
