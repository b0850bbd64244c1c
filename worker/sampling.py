"""Per-request samplers and logits processors, so one batch can mix settings.

Each seeded request owns its PRNG key: the same seed gives the same tokens whatever
else shares the batch (the global MLX random state would interleave requests).

Order of a step, for one request: the model's logits, then `logit_bias`, then the
penalties (worker/penalties.py), then a grammar's mask; normalized to log-probabilities
(what `logprobs` reports); then `top_p`, `min_p` and `top_k` drop tokens, each judged on
that distribution at temperature 1 (as llama.cpp and mlx-lm do, unlike vLLM and Hugging
Face, which apply the temperature first); then the kept tokens' log-probabilities are
divided by the temperature and one is drawn. So the temperature never changes which
tokens can be drawn, only how likely each kept one is.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.sample_utils import (
    Sampler,
    LogitsProcessor,
    apply_min_p,
    apply_top_k,
    apply_top_p,
    make_logits_processors,
)

from protocol.messages import SamplingParams
from worker.penalties import make_penalties


def greedy(logprobs: mx.array) -> mx.array:
    return mx.argmax(logprobs, axis=-1)


def keep_likely(logprobs: mx.array, params: SamplingParams, vocab_size: int) -> mx.array:
    """`logprobs` with the tokens `top_p`, `min_p` and `top_k` drop set to -inf; the kept
    set is the intersection of the three, each judged on the whole distribution given:
    - top_p: a token is kept iff the tokens strictly more likely than it hold less than
      `top_p` of the mass (so the token that reaches `top_p` is kept, the next is not, and
      tokens tied with a kept one are kept);
    - min_p: a token is kept iff its probability is at least `min_p` times the top one's;
    - top_k: the `top_k` most likely tokens (a tie at the k-th is broken arbitrarily).
    Rows are independent."""
    if 0.0 < params.top_p < 1.0:
        logprobs = apply_top_p(logprobs, params.top_p)
    if params.min_p > 0.0:
        logprobs = apply_min_p(logprobs, params.min_p)
    if 0 < params.top_k < vocab_size:
        logprobs = apply_top_k(logprobs, params.top_k)
    return logprobs


class RequestSampler:
    """One request's draw at temperature > 0: the tokens `keep_likely` keeps, their
    log-probabilities divided by the temperature (`scaled`), one drawn with the request's
    own key when it is seeded. `scaled` and `next_key` are public so speculation can
    judge drafts by the very distribution a plain step draws from."""

    def __init__(self, params: SamplingParams, vocab_size: int) -> None:
        self._params = params
        self._vocab_size = vocab_size
        self._inverse_temperature = 1.0 / params.temperature
        # OpenAI seeds are signed 64-bit, MLX keys unsigned: the same seed always maps to one key
        self._key = mx.random.key(params.seed % 2**64) if params.seed is not None else None

    def scaled(self, logprobs: mx.array) -> mx.array:
        return keep_likely(logprobs, self._params, self._vocab_size) * self._inverse_temperature

    def next_key(self) -> mx.array | None:
        """The next key of a seeded request's sequence (None: the global generator's)."""
        if self._key is None:
            return None
        self._key, sub = mx.random.split(self._key)
        return sub

    def __call__(self, logprobs: mx.array) -> mx.array:
        return mx.random.categorical(self.scaled(logprobs), key=self.next_key())


def make_request_sampler(params: SamplingParams, vocab_size: int) -> Sampler:
    """Sampler for one request: greedy at temperature 0, else a `RequestSampler`."""
    if params.temperature <= 0.0:
        return greedy
    return RequestSampler(params, vocab_size)


def make_request_processors(params: SamplingParams, prompt_length: int) -> list[LogitsProcessor]:
    """`logit_bias`, then the penalties (over the whole answer, see worker/penalties.py);
    empty when the request asks for neither (the fast path: no processor runs).
    `prompt_length`: how many of the context's first tokens are the prompt."""
    processors = make_logits_processors(
        logit_bias={int(k): float(v) for k, v in params.logit_bias.items()} or None)
    penalties = make_penalties(params, prompt_length)
    if penalties is not None:
        processors.append(penalties)
    return processors
