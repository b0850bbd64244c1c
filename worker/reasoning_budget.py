"""A thinking budget: once a request's reasoning span has run `budget` tokens, the worker
closes the span itself (it forces the template's close marker, token by token) and the
model goes on to answer.

Why force the marker and not stop: the client asked for an answer with at most that much
thinking; ending the request would leave it with no answer at all. The forced tokens are
the marker's own tokenization, so the answer that follows reads exactly as if the model
had closed the span, and the cache keeps those tokens like any generated ones.

A logits processor (mlx-lm's interface: the row's tokens so far and its logits), so it
works alone and in the batch; a row with it does not speculate, like any processor's.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from worker.reasoning_span import ReasoningSpan


class ReasoningBudget:
    """Counts the tokens generated inside the span and, past `budget`, forces the close."""

    def __init__(self, tokenizer: Any, open_marker: str, close_marker: str, opens_in_prompt: bool,
                 budget: int) -> None:
        self._tokenizer = tokenizer
        self._forced = list(tokenizer.encode("\n" + close_marker + "\n\n", add_special_tokens=False))
        self._span = ReasoningSpan(open_marker, close_marker, opens_in_prompt)
        self._budget = budget
        self._spent = 0  # tokens generated inside the span
        self._forcing = -1  # index of the next forced token; -1: not forcing
        self._calls = 0

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        self._calls += 1
        if self._calls > 1 and self._forcing < 0:  # the row's last token is one this request generated
            self._span.see(self._tokenizer.decode([int(tokens[-1].item())]).encode())
        if self._forcing < 0 and not self._span.inside:
            return logits  # before the span opens, or past it (closed by the model, or never opened)
        if self._forcing < 0 and self._spent >= self._budget:
            self._forcing = 0
        if self._forcing >= 0:
            if self._forcing == len(self._forced):
                return logits  # the close is written: the answer is the model's
            token = self._forced[self._forcing]
            self._forcing += 1
            return mx.where(mx.arange(logits.shape[-1]) == token, logits, -mx.inf)
        self._spent += 1  # the token about to be drawn is reasoning
        return logits
