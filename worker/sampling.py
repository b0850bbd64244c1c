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


def make_request_sampler(params: SamplingParams, vocab_size: int) -> Sampler:
    """Sampler for one request: greedy at temperature 0, else a draw from the tokens
    `keep_likely` keeps, their log-probabilities divided by the temperature."""
    if params.temperature <= 0.0:
        return greedy
    temperature = params.temperature
    # OpenAI seeds are signed 64-bit, MLX keys unsigned: the same seed always maps to one key
    key = [mx.random.key(params.seed % 2**64)] if params.seed is not None else None

    def sample(logprobs: mx.array) -> mx.array:
        scaled = keep_likely(logprobs, params, vocab_size) * (1.0 / temperature)
        if key is None:
            return mx.random.categorical(scaled)
        key[0], sub = mx.random.split(key[0])
        return mx.random.categorical(scaled, key=sub)

    return sample


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
