"""One decode step's grammar work for the whole batch: every constrained sequence's new
token read in one host sync, all their masks computed at once on every core, and applied
to the batch's logits in one operation."""

from __future__ import annotations

import os
import time
from typing import Any

import llguidance
import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.generate import BatchGenerator

from worker.batch_adapter import decode_step_uids, take_processors
from worker.grammar import FREE, GrammarProcessor


class GrammarBatch:
    """Masks the constrained rows of each decode step of the running batch itself, in
    the model's forward (`MaskedModel`), instead of through mlx-lm's per-row processors.

    Why: as a logits processor, each constrained row cost its own slice of the logits,
    mask upload, `where` and a concatenation of every row, a token context update, and
    a host sync; at 8 constrained streams of the default model that was 5% of a step,
    of which computing the masks was not 1% (measured in-process, interleaved).
    Here the step pays one sync, one executor call for every mask and one `where`;
    a batch whose rows are all free before their triggers pays the sync alone.

    A request's processor starts as an mlx-lm logits processor: its first step (in the
    small batch mlx-lm makes for a sequence that finished its prompt, or a prefix hit's
    first token) is called with its context, which it reads itself. When a step begins,
    every processor called in the step before is *steady*: the token this step feeds its
    row is exactly the one sampled since. `begin` then takes it out of mlx-lm's lists
    (worker/batch_adapter.py `take_processors`) and masks its row from here on. When
    mlx-lm's internals have moved, nothing is taken and every processor runs alone.

    A taken grammar masks before the row's other processors (logit_bias, penalties)
    instead of after them: the same tokens, since those only add to or scale a logit
    and -inf stays -inf under both.
    """

    def __init__(self, vocab_size: int, num_threads: int | None = None) -> None:
        self.step = 0
        self._generator: BatchGenerator | None = None
        self._rows: dict[int, GrammarProcessor] = {}  # uid -> the processor this batch masks for
        self._words = np.zeros((8, (vocab_size + 31) // 32), dtype=np.int32)
        threads = num_threads or min(os.cpu_count() or 1, 8)  # more than a batch's masks would idle
        self._executor = llguidance.LLExecutor(num_threads=threads)
        self._overlap = mx.default_device().type == mx.DeviceType.gpu
        # host time since start, for the step's time split (Engine.stats): waiting for the
        # step before to finish so its tokens can be read, and consuming them + masks
        self.wait_s = 0.0
        self.mask_s = 0.0

    def begin(self, generator: BatchGenerator) -> None:
        """A new step of `generator` is about to run: take over the steady processors."""
        self.step += 1
        if generator is not self._generator:
            self._rows.clear()
        self._generator = generator
        steady = take_processors(generator, self._is_steady)
        self._rows.update(steady)

    def held(self, uid: int) -> GrammarProcessor | None:
        """The processor this batch masks `uid`'s row for, if any. A step that feeds a
        row several positions (speculation) is masked at its first position only: the
        row's drafts go only as far as its `free_ahead` says no mask is needed."""
        return self._rows.get(uid)

    def _is_steady(self, processor: Any) -> bool:
        return isinstance(processor, GrammarProcessor) and processor.last_step == self.step - 1

    def mask(self, inputs: mx.array, cache: Any, logits: mx.array) -> mx.array:
        """`logits` of a model call with every constrained row's forbidden tokens at -inf
        when the call is the running batch's decode step; untouched otherwise."""
        if not self._rows or self._generator is None:
            return logits
        uids = decode_step_uids(self._generator, cache)
        if uids is None:
            return logits
        live = set(uids)
        for uid in [u for u in self._rows if u not in live]:  # finished or aborted
            del self._rows[uid]
        rows = [(row, self._rows[uid]) for row, uid in enumerate(uids) if uid in self._rows]
        if not rows:
            return logits
        # The step's forward pass is dispatched before the sync, so it queues behind the
        # step before's and the stream does not idle while the host reads the tokens and
        # computes the masks: on a GPU the whole pass overlaps them, on the CPU the tail
        # the dispatch leaves. On the CPU only for a batch: a lone row's short pass then
        # competes with its masks for the cores (bench/structured.py, SmolLM2: with the
        # dispatch n8 1.009 and n1 0.869 of free, without it 0.924 and 0.937)
        if self._overlap or len(uids) > 1:
            mx.async_eval(logits)
        waited = time.perf_counter()
        tokens = inputs[:, 0].tolist()  # the one host sync of the step (a wide step: each row's first position)
        started = time.perf_counter()
        self.wait_s += started - waited
        allowed = self._allowed(rows, tokens)
        spent = time.perf_counter() - started
        self.mask_s += spent
        share = spent / len(rows)
        for _, processor in rows:
            processor.last_step = self.step
            processor.seconds += share
            processor.num_masks += 1
            processor.num_batched += 1
        held = [(row, mask) for row, mask in allowed if mask is not FREE]
        if not held:
            return logits
        width = logits.shape[-1]
        full = np.ones((logits.shape[0], width), dtype=np.bool_)
        for row, mask in held:
            n = min(width, mask.shape[0])
            full[row, :n] = mask[:n]
            full[row, n:] = False  # logits wider than the vocabulary: padding ids, never allowed
        first = mx.where(mx.array(full)[:, None, :], logits[:, :1], mx.array(-mx.inf, dtype=logits.dtype))
        return first if logits.shape[1] == 1 else mx.concatenate([first, logits[:, 1:]], axis=1)

    def _allowed(self, rows: list[tuple[int, GrammarProcessor]], tokens: list[int]) -> list[tuple[int, np.ndarray]]:
        """Each row's processor fed its new token, then every mask the matchers need
        computed in one executor call; (row, allowed tokens or FREE)."""
        for row, processor in rows:
            processor.consume([tokens[row]])
        masked = [p for _, p in rows if p.needs_mask]
        words = self._buffer(len(masked))
        if masked:
            self._executor.unsafe_compute_mask_ptr([(p.matcher, i) for i, p in enumerate(masked)],
                                                   words.ctypes.data, words.shape[1] * 4, len(masked))
        index = {id(p): i for i, p in enumerate(masked)}
        allowed = []
        for row, processor in rows:
            processor.check_matcher()
            i = index.get(id(processor))
            allowed.append((row, processor.allowed(words[i] if i is not None else None)))
        return allowed

    def note_alone(self, wait_s: float, mask_s: float) -> None:
        """A processor read its tokens and computed its mask alone (a first step)."""
        self.wait_s += wait_s
        self.mask_s += mask_s

    def _buffer(self, num_rows: int) -> np.ndarray:
        """Room for `num_rows` masks, reused from step to step."""
        if self._words.shape[0] < num_rows:
            self._words = np.zeros((num_rows, self._words.shape[1]), dtype=np.int32)
        return self._words


class MaskedModel:
    """The model as the BatchGenerator calls it: the forward pass, then the grammar
    masks of the running batch's constrained rows (`GrammarBatch.mask`). Everything
    else (layers, make_cache, args) is the model's own."""

    def __init__(self, model: nn.Module, grammar: GrammarBatch) -> None:
        self._model = model
        self._grammar = grammar

    def __call__(self, inputs: mx.array, cache: Any = None, **kwargs: Any) -> mx.array:
        logits = self._model(inputs, cache=cache, **kwargs)
        return self._grammar.mask(inputs, cache, logits)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)
