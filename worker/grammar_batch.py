"""One decode step's grammar work for the whole batch: every constrained sequence's new
token read in one host sync, and all their masks computed at once on every core."""

from __future__ import annotations

import os
import time

import llguidance
import mlx.core as mx
import numpy as np
from mlx_lm.generate import BatchGenerator

from worker.batch_adapter import decoding_rows
from worker.grammar import GrammarProcessor


class GrammarBatch:
    """Prepares the masks of a step's constrained sequences when the first of them is
    called, so each `GrammarProcessor` call then only applies its own.

    Why: called one by one, each processor read its token (a host sync of ~140 µs on
    the CPU) and computed its mask alone on one core (~270 µs right after a forward
    pass), 3.5 ms of a 109 ms step at 8 constrained streams of the default model.

    Invariant: a processor is prepared only when it is *steady*: called in the step
    before this one, so its context grew by exactly the one token this step feeds its
    row, `decoding_rows`' `tokens[row]`. Any other call (a sequence's first step, a
    prefix hit's first token, a new sequence's first step outside the running batch)
    is left to the processor alone, as is everything when mlx-lm's internals moved.
    """

    def __init__(self, vocab_size: int, num_threads: int | None = None) -> None:
        self.step = 0
        self._generator: BatchGenerator | None = None
        self._prepared_step = -1
        self._masks: dict[int, np.ndarray] = {}  # id(processor) -> its allowed tokens this step
        self._words = np.zeros((8, (vocab_size + 31) // 32), dtype=np.int32)
        threads = num_threads or min(os.cpu_count() or 1, 8)  # more than a batch's masks would idle
        self._executor = llguidance.LLExecutor(num_threads=threads)
        # host time since start, for the step's time split (Engine.stats): waiting for the
        # step before to finish so its tokens can be read, and consuming them + masks
        self.wait_s = 0.0
        self.mask_s = 0.0

    def begin(self, generator: BatchGenerator) -> None:
        """A new step of `generator` is about to run."""
        self.step += 1
        self._generator = generator
        self._masks.clear()

    def take(self, processor: GrammarProcessor, context: mx.array) -> np.ndarray | None:
        """`processor`'s allowed tokens for this step if the batch prepared them, or None
        (then the processor computes them itself)."""
        if self._prepared_step != self.step:
            self._prepared_step = self.step
            self._prepare()
        allowed = self._masks.pop(id(processor), None)
        if allowed is not None and context.shape[0] != processor.next_position:
            # cannot happen while the invariant holds; never mask by a guess
            processor.fail("the batch's token stream and this sequence's context disagree")
            return processor.allowed(None)
        return allowed

    def _prepare(self) -> None:
        if self._generator is None:
            return
        rows = decoding_rows(self._generator)
        if rows is None:
            return
        processors, tokens = rows
        steady = [(row, p) for row, procs in enumerate(processors) for p in (procs or ())
                  if isinstance(p, GrammarProcessor) and p.last_step == self.step - 1]
        if not steady:
            return
        waited = time.perf_counter()
        new_tokens = tokens.tolist()  # the one host sync of the step
        started = time.perf_counter()
        self.wait_s += started - waited
        for row, processor in steady:
            processor.consume([new_tokens[row]])
        masked = [p for _, p in steady if p.needs_mask]
        words = self._buffer(len(masked))
        if masked:
            self._executor.unsafe_compute_mask_ptr([(p.matcher, i) for i, p in enumerate(masked)],
                                                   words.ctypes.data, words.shape[1] * 4, len(masked))
        rows_of = {id(p): i for i, p in enumerate(masked)}
        for _, processor in steady:
            processor.check_matcher()
            i = rows_of.get(id(processor))
            self._masks[id(processor)] = processor.allowed(words[i] if i is not None else None)
        spent = time.perf_counter() - started
        self.mask_s += spent
        share = spent / len(steady)
        for _, processor in steady:
            processor.seconds += share
            processor.num_masks += 1
            processor.num_batched += 1

    def note_alone(self, wait_s: float, mask_s: float) -> None:
        """A processor read its tokens and computed its mask alone (see `take`)."""
        self.wait_s += wait_s
        self.mask_s += mask_s

    def _buffer(self, num_rows: int) -> np.ndarray:
        """Room for `num_rows` masks, reused from step to step."""
        if self._words.shape[0] < num_rows:
            self._words = np.zeros((num_rows, self._words.shape[1]), dtype=np.int32)
        return self._words
