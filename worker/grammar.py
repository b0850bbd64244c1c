"""Constrained decoding: a request's `Constraint` compiled by llguidance into a matcher,
and the matcher run as that request's logits processor inside the continuous batch.

Constrained and free sequences decode in the same step: only a constrained sequence has
this processor, so a batch without one never runs it (mlx-lm skips the per-sequence
processor loop when no sequence has processors).
"""

from __future__ import annotations

import time
from typing import Protocol

import llguidance
import mlx.core as mx
import numpy as np

from protocol.constraints import grammar_for
from protocol.errors import RequestError
from protocol.messages import Constraint
from worker.vocabulary import TokenVocabulary


# What `allowed` returns when no token is held back at all (a lazy grammar before its
# trigger): the logits pass through untouched, with no mask applied.
FREE = np.ones(0, dtype=np.bool_)


class StepMasks(Protocol):
    """What a processor tells the engine's batch masker (worker/grammar_batch.py
    `GrammarBatch`; a Protocol so that module can import this one)."""

    step: int

    def note_alone(self, wait_s: float, mask_s: float) -> None: ...


class GrammarError(RuntimeError):
    """The grammar engine stopped on a request mid-generation (a resource limit of a
    pathological grammar, or a token it refused): that request fails, no other."""


class GrammarCompiler:
    """Compiles constraints against the worker's vocabulary; thread-safe (llguidance
    compiles without the GIL), so the tokenizer thread can do it off the engine loop."""

    def __init__(self, vocabulary: TokenVocabulary) -> None:
        self.vocabulary = vocabulary

    def compile(self, constraint: Constraint) -> llguidance.LLMatcher:
        """A fresh matcher at the grammar's start, or the RequestError (a 400) naming why
        the constraint cannot be enforced. The router checks the same grammar first, so
        this refuses only what depends on the vocabulary."""
        param = "response_format" if constraint.kind.startswith("json") else None
        try:
            grammar = grammar_for(constraint)
        except ValueError as exc:
            raise RequestError(f"the output constraint is invalid: {exc}", param=param) from None
        matcher = llguidance.LLMatcher(self.vocabulary.llg, grammar, log_level=0)
        if matcher.is_error() and constraint.kind == "lark":  # it may name added tokens: <tool_call>
            named = llguidance.LLMatcher(self.vocabulary.llg_named, grammar, log_level=0)
            matcher = matcher if named.is_error() else named
        if matcher.is_error():
            raise RequestError(f"the output constraint cannot be enforced: {matcher.get_error()}", param=param)
        return matcher


class GrammarProcessor:
    """One request's matcher as an mlx-lm logits processor: `(context, logits) -> logits`
    with every token the grammar forbids at -inf.

    Invariant: the matcher has consumed exactly the tokens of `context` from
    `prompt_length` on. Each call consumes the tokens sampled since the last call
    (normally one: the batch calls it once per decode step, with the prompt and every
    token sampled so far as context; a prefix hit's first token, sampled outside the
    batch, arrives as the first such token), then masks the next token's logits.
    Once the grammar is complete its mask allows only EOS, so the request ends with "stop".

    This call is a request's first step, or every step when mlx-lm's internals have
    moved: from its second step on, the engine's `GrammarBatch` takes the processor out
    of mlx-lm's lists and masks its row with the rest of the batch's, in the forward
    pass, through the same `consume`, `mask_into` and `allowed`.

    When: a step's masks need the tokens sampled by the step before. On a GPU the step's
    forward pass is dispatched first and runs while the masks are computed. On MLX's CPU
    stream that dispatch itself runs most of the pass on both cores (`async_eval`
    returns when ~80% of the pass is done), so only the pass's tail can overlap: a
    processor running alone (one step per request) does not dispatch there; the batch's
    masker does (worker/grammar_batch.py).

    Never raises inside a step (that would fail every sequence in the batch): an engine
    error is kept in `error`, the mask then allows only EOS, and the engine fails this
    request when it sees the token (`check`).
    """

    def __init__(self, matcher: llguidance.LLMatcher, prompt_length: int, vocabulary: TokenVocabulary,
                 batch: StepMasks | None = None) -> None:
        self.matcher = matcher
        self.next_position = prompt_length  # in the context: the next token to consume
        self.last_step = -1  # the batch step of the last call; -1: never called
        self._batch = batch
        self._vocab_size = vocabulary.vocab_size
        self._words = np.zeros((vocabulary.vocab_size + 31) // 32, dtype=np.int32)
        self._eos_only = np.zeros(vocabulary.vocab_size, dtype=np.bool_)
        self._eos_only[[t for t in vocabulary.eos_token_ids if t < vocabulary.vocab_size]] = True
        self._overlap = mx.default_device().type == mx.DeviceType.gpu  # see "When" above
        self.error: str | None = None
        self.seconds = 0.0  # host time spent in the matcher: consuming tokens and masks
        self.num_masks = 0
        self.num_batched = 0  # masks the GrammarBatch computed with others'

    def __call__(self, context: mx.array, logits: mx.array) -> mx.array:
        if self._overlap:
            mx.async_eval(logits)
        # The one host sync: the tokens sampled since the last call (already computed).
        start = self.next_position
        waited = time.perf_counter()
        new_tokens = context[start:].tolist() if context.shape[0] > start else []
        started = time.perf_counter()
        self.consume(new_tokens)
        allowed = self.allowed(self._words if self.mask_into(self._words) else None)
        spent = time.perf_counter() - started
        self.seconds += spent
        self.num_masks += 1
        if self._batch is not None:
            self._batch.note_alone(started - waited, spent)
        self.last_step = self._batch.step if self._batch is not None else 0
        if allowed is FREE:
            return logits
        width = logits.shape[-1]
        if allowed.shape[0] != width:  # logits wider than the vocabulary: padding ids, never allowed
            allowed = allowed[:width] if allowed.shape[0] > width else np.pad(allowed, (0, width - allowed.shape[0]))
        return mx.where(mx.array(allowed), logits, mx.array(-mx.inf, dtype=logits.dtype))

    @property
    def needs_mask(self) -> bool:
        """Whether the next mask comes from the matcher (else it is EOS only)."""
        return self.error is None and not self.matcher.is_stopped()

    def free_ahead(self, tokens: list[int]) -> int:
        """How many of `tokens` this grammar would consume with no mask needed after any
        of them (speculation drafts only that far): none for a grammar that holds every
        token; a lazy one before its trigger says more (worker/lazy_grammar.py)."""
        return 0

    def consume(self, new_tokens: list[int]) -> None:
        """Advance the matcher over `new_tokens`, the next ones of the context."""
        self.next_position += len(new_tokens)
        if self.error is None:
            for token in new_tokens:
                if not self.matcher.consume_token(token):
                    self.fail(self.matcher.get_error() or f"the grammar refused token {token}")
                    break

    def mask_into(self, words: np.ndarray) -> bool:
        """Write the next token's mask into `words` (one bit per id); False when no mask
        is needed (EOS only)."""
        if not self.needs_mask:
            return False
        self.matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        self.check_matcher()
        return self.error is None

    def check_matcher(self) -> None:
        """Keep the matcher's error, if computing a mask ran into one."""
        if self.error is None and self.matcher.is_error():
            self.fail(self.matcher.get_error())

    def allowed(self, words: np.ndarray | None) -> np.ndarray:
        """Which tokens may come next, one bool per vocabulary id: the bits of `words`
        (a mask just computed), or EOS only."""
        if words is None or not self.needs_mask:
            return self._eos_only
        return np.unpackbits(words.view(np.uint8), bitorder="little", count=self._vocab_size).view(np.bool_)

    def fail(self, error: str) -> None:
        """Stop enforcing: the request ends at the next token (see the class docstring)."""
        if self.error is None:
            self.error = error

    def check(self) -> None:
        """Raise the GrammarError if the matcher failed (see the class docstring)."""
        if self.error is not None:
            raise GrammarError(f"the grammar engine stopped: {self.error}")
