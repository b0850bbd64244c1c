"""The repetition, presence and frequency penalties of one request, counted over its whole
answer (and, for the repetition penalty, its prompt): not over a window of recent tokens,
as mlx-lm's processors are (the last 20 tokens of prompt + answer)."""

from __future__ import annotations

import math

import mlx.core as mx

from protocol.messages import SamplingParams


class Penalties:
    """One request's penalties, as a logits processor (`processor(context, logits)`).

    What each moves, with c[t] the number of times token t was sampled in this answer so
    far (OpenAI's documented formula for presence and frequency, which count sampled tokens
    only, as vLLM does; the repetition penalty looks at the prompt too, as Hugging Face's
    and vLLM's do):
    - repetition r: every token of the prompt or the answer: logit / r if logit > 0,
      logit * r if logit < 0 (sign-aware: a penalty > 1 always makes it less likely);
    - frequency f: logit - f * c[t];
    - presence p: logit - p if c[t] > 0.
    They apply in that order (vLLM's), after `logit_bias` and before a grammar's mask.

    The processor is called once a step with the context so far: the prompt, then the
    tokens sampled before this step (what mlx-lm's BatchGenerator and `prefill_rest` pass;
    its first `prompt_length` tokens are the prompt). It counts only the tokens it has not
    seen yet, so a step costs a scatter of one token and a few elementwise operations over
    the vocabulary, however long the answer. Invariant: the context only grows between
    calls; a shorter one (never expected) is recounted from scratch.
    """

    def __init__(self, prompt_length: int, repetition: float = 1.0, presence: float = 0.0,
                 frequency: float = 0.0) -> None:
        self._prompt_length = prompt_length
        self._repetition = repetition
        self._presence = presence
        self._frequency = frequency
        self._num_counted = 0
        self._answer_counts: mx.array | None = None  # (vocab,) float32: c[t]
        self._in_prompt: mx.array | None = None  # (vocab,) bool, for the repetition penalty

    @property
    def answer_counts(self) -> mx.array | None:
        """How many times each token was sampled in the answer, as of the last call."""
        return self._answer_counts

    def __call__(self, context: mx.array, logits: mx.array) -> mx.array:
        self._count(context, logits.shape[-1])
        counts = self._answer_counts
        assert counts is not None and self._in_prompt is not None
        logits = logits.astype(mx.float32)
        if self._repetition != 1.0:
            repeated = self._in_prompt | (counts > 0)
            penalized = mx.where(logits < 0, logits * self._repetition, logits / self._repetition)
            logits = mx.where(repeated, penalized, logits)
        if self._frequency:
            logits = logits - self._frequency * counts
        if self._presence:
            logits = logits - self._presence * (counts > 0)
        return logits

    def _count(self, context: mx.array, vocab_size: int) -> None:
        """Add the context's tokens not counted yet: prompt tokens to `_in_prompt`, answer
        tokens to `_answer_counts`."""
        length = context.shape[0]
        if self._answer_counts is None or length < self._num_counted or self._answer_counts.shape[0] != vocab_size:
            self._answer_counts = mx.zeros((vocab_size,), dtype=mx.float32)
            self._in_prompt = mx.zeros((vocab_size,), dtype=mx.bool_)
            self._num_counted = 0
        start, split = self._num_counted, self._prompt_length
        if length <= start:
            return
        if self._repetition != 1.0 and start < split:
            prompt = context[start : min(length, split)]
            self._in_prompt = self._in_prompt | (mx.zeros((vocab_size,), mx.float32).at[prompt].add(1.0) > 0)
        if length > split:
            answer = context[max(start, split) : length]
            self._answer_counts = self._answer_counts.at[answer].add(1.0)
        self._num_counted = length


def make_penalties(params: SamplingParams, prompt_length: int) -> Penalties | None:
    """The request's penalties, or None when it asks for none (no processor: the fast path)."""
    repetition = params.repetition_penalty
    repetition = 1.0 if not repetition or math.isclose(repetition, 1.0) else repetition
    if repetition == 1.0 and not params.presence_penalty and not params.frequency_penalty:
        return None
    return Penalties(prompt_length, repetition, params.presence_penalty, params.frequency_penalty)
