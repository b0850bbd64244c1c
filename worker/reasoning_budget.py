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

TAIL_CHARS = 64  # the generated text kept to spot a marker that spans tokens
OPEN_WITHIN = 16  # a span the model opens must open within its first tokens (later, it is answer text)


class ReasoningBudget:
    """Counts the tokens generated inside the span and, past `budget`, forces the close."""

    def __init__(self, tokenizer: Any, open_marker: str, close_marker: str, opens_in_prompt: bool,
                 budget: int) -> None:
        self._tokenizer = tokenizer
        self._open, self._close = open_marker, close_marker
        self._forced = list(tokenizer.encode("\n" + close_marker + "\n\n", add_special_tokens=False))
        self._inside = opens_in_prompt
        self._budget = budget
        self._spent = 0  # tokens generated inside the span
        self._forcing = -1  # index of the next forced token; -1: not forcing
        self._done = False
        self._calls = 0
        self._tail = ""

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        self._calls += 1
        if self._calls > 1:  # the row's last token is one this request generated
            self._observe(int(tokens[-1].item()))
        if self._done:
            return logits
        if self._forcing < 0 and self._inside and self._spent >= self._budget:
            self._forcing = 0
        if self._forcing >= 0:
            token = self._forced[self._forcing]
            self._forcing += 1
            if self._forcing == len(self._forced):
                self._done = True
            return mx.where(mx.arange(logits.shape[-1]) == token, logits, -mx.inf)
        if self._inside:
            self._spent += 1  # the token about to be drawn is reasoning
        return logits

    def _observe(self, token: int) -> None:
        if self._done or self._forcing >= 0:
            return
        self._tail = (self._tail + self._tokenizer.decode([token]))[-TAIL_CHARS:]
        if not self._inside and self._open in self._tail:
            self._inside, self._tail = True, self._tail.split(self._open, 1)[1]
        elif not self._inside and self._calls > OPEN_WITHIN:
            self._done = True  # it answered without reasoning
        elif self._inside and self._close in self._tail:
            self._done = True  # the model closed it within its budget
