"""Per-token log-probabilities for the requests that ask for them.

They come from the distribution the token was drawn from: mlx-lm's normalized logits
after every logits processor (penalties, logit bias, the grammar's mask), the very row
the sampler read. Requests that do not ask never reach this module.
"""

from __future__ import annotations

import math

import mlx.core as mx

from protocol.messages import TokenLogprobs
from worker.vocabulary import TokenVocabulary

MAX_TOP_LOGPROBS = 20  # OpenAI's bound for chat; completions allow at most 5
FLOOR_LOGPROB = -9999.0  # what OpenAI reports for "impossible": JSON has no -inf


class LogprobsReporter:
    """Turns a sampled token and its distribution into a `TokenLogprobs` entry: the
    token's own log-probability and the `num_top` most likely tokens, best first.
    Tokens a grammar forbade (-inf) never appear among the alternatives."""

    def __init__(self, num_top: int, vocabulary: TokenVocabulary) -> None:
        self.num_top = max(0, min(num_top, MAX_TOP_LOGPROBS))
        self._vocabulary = vocabulary

    def entry(self, token: int, logprobs: mx.array) -> TokenLogprobs:
        """The figures for `token`, drawn from `logprobs` (one row over the vocabulary)."""
        token_bytes = self._vocabulary.token_bytes
        chosen = float(logprobs[token].item())
        chosen = chosen if math.isfinite(chosen) else FLOOR_LOGPROB
        top_bytes: list[bytes] = []
        top_values: list[float] = []
        if self.num_top:
            width = logprobs.shape[-1]
            ids = mx.argpartition(logprobs, kth=width - self.num_top)[width - self.num_top:]
            values = logprobs[ids]
            pairs = sorted(zip(values.tolist(), ids.tolist()), key=lambda pair: (-pair[0], pair[1]))
            for value, other in pairs:
                if math.isfinite(value):
                    top_bytes.append(token_bytes(other))
                    top_values.append(value)
        return TokenLogprobs([token_bytes(token)], [chosen], [top_bytes], [top_values])
