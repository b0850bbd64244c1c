"""Constrained decoding: a request's `Constraint` compiled by llguidance into a matcher,
and the matcher run as that request's logits processor inside the continuous batch.

Constrained and free sequences decode in the same step: only a constrained sequence has
this processor, so a batch without one never runs it (mlx-lm skips the per-sequence
processor loop when no sequence has processors).
"""

from __future__ import annotations

import time

import llguidance
import mlx.core as mx
import numpy as np

from protocol.constraints import grammar_for
from protocol.errors import RequestError
from protocol.messages import Constraint
from worker.vocabulary import TokenVocabulary


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
    `prompt_length` on. Each call first consumes the tokens sampled since the last call
    (normally one: the batch calls it once per decode step, with the prompt and every
    token sampled so far as context; a prefix hit's first token, sampled outside the
    batch, arrives as the first such token), then masks the next token's logits. Once
    the grammar is complete its mask allows only EOS, so the request ends with "stop".

    When: the mask for a step needs the token sampled by the step before, which the
    host reads here, its one sync. On a GPU the step's forward pass is dispatched first
    and runs while the mask is computed. On MLX's CPU stream that dispatch itself runs
    most of the pass on both cores, so nothing can overlap it; and reading the token any
    earlier (right after the step that sampled it, to compute the mask on a thread) was
    measured slower: that read waits for the tail of the previous pass, which otherwise
    runs while the engine sends tokens and builds the next step's graph.

    Never raises inside a step (that would fail every sequence in the batch): an engine
    error is kept in `error`, the mask then allows only EOS, and the engine fails this
    request when it sees the token (`check`).
    """

    def __init__(self, matcher: llguidance.LLMatcher, prompt_length: int, vocabulary: TokenVocabulary) -> None:
        self._matcher = matcher
        self._next_position = prompt_length  # in the context: the next token to consume
        self._vocab_size = vocabulary.vocab_size
        self._words = np.zeros((vocabulary.vocab_size + 31) // 32, dtype=np.int32)
        self._eos_only = np.zeros(vocabulary.vocab_size, dtype=np.bool_)
        self._eos_only[[t for t in vocabulary.eos_token_ids if t < vocabulary.vocab_size]] = True
        self._overlap = mx.default_device().type == mx.DeviceType.gpu  # see "When" above
        self.error: str | None = None
        self.seconds = 0.0  # host time spent in the matcher: consuming tokens and masks
        self.num_masks = 0

    def __call__(self, context: mx.array, logits: mx.array) -> mx.array:
        if self._overlap:
            mx.async_eval(logits)
        # The one host sync: the tokens sampled since the last call (already computed).
        start = self._next_position
        new_tokens = context[start:].tolist() if context.shape[0] > start else []
        self._next_position = start + len(new_tokens)
        allowed = self._allowed(new_tokens)
        width = logits.shape[-1]
        if allowed.shape[0] != width:  # logits wider than the vocabulary: padding ids, never allowed
            allowed = allowed[:width] if allowed.shape[0] > width else np.pad(allowed, (0, width - allowed.shape[0]))
        return mx.where(mx.array(allowed), logits, mx.array(-mx.inf, dtype=logits.dtype))

    def _allowed(self, new_tokens: list[int]) -> np.ndarray:
        """Consume `new_tokens`; which tokens may come next, one bool per vocabulary id."""
        started = time.perf_counter()
        if self.error is None:
            for token in new_tokens:
                if not self._matcher.consume_token(token):
                    self.error = self._matcher.get_error() or f"the grammar refused token {token}"
                    break
        if self.error is None:
            self._matcher.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
            if self._matcher.is_error():
                self.error = self._matcher.get_error()
        if self.error is not None or self._matcher.is_stopped():
            allowed = self._eos_only
        else:
            allowed = np.unpackbits(self._words.view(np.uint8), bitorder="little", count=self._vocab_size).view(np.bool_)
        self.seconds += time.perf_counter() - started
        self.num_masks += 1
        return allowed

    def check(self) -> None:
        """Raise the GrammarError if the matcher failed (see the class docstring)."""
        if self.error is not None:
            raise GrammarError(f"the grammar engine stopped: {self.error}")
