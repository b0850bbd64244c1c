"""Per-request samplers and logits processors, so one batch can mix settings.

Each seeded request owns its PRNG key: the same seed gives the same tokens whatever
else shares the batch (the global MLX random state would interleave requests).
"""

from __future__ import annotations

import math

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


def greedy(logprobs: mx.array) -> mx.array:
    return mx.argmax(logprobs, axis=-1)


def make_request_sampler(params: SamplingParams, vocab_size: int) -> Sampler:
    """Sampler for one request: greedy at temperature 0, else filtered categorical."""
    if params.temperature <= 0.0:
        return greedy
    temperature = params.temperature
    top_p, top_k, min_p = params.top_p, params.top_k, params.min_p
    # OpenAI seeds are signed 64-bit, MLX keys unsigned: the same seed always maps to one key
    key = [mx.random.key(params.seed % 2**64)] if params.seed is not None else None

    def sample(logprobs: mx.array) -> mx.array:
        if 0.0 < top_p < 1.0:
            logprobs = apply_top_p(logprobs, top_p)
        if min_p > 0.0:
            logprobs = apply_min_p(logprobs, min_p)
        if 0 < top_k < vocab_size:
            logprobs = apply_top_k(logprobs, top_k)
        scaled = logprobs * (1.0 / temperature)
        if key is None:
            return mx.random.categorical(scaled)
        key[0], sub = mx.random.split(key[0])
        return mx.random.categorical(scaled, key=sub)

    return sample


def make_request_processors(params: SamplingParams) -> list[LogitsProcessor]:
    """Penalties and logit bias; empty when the request asks for none (fast path)."""
    rep = params.repetition_penalty
    return make_logits_processors(
        logit_bias={int(k): float(v) for k, v in params.logit_bias.items()} or None,
        repetition_penalty=rep if rep and not math.isclose(rep, 1.0) else None,
        presence_penalty=params.presence_penalty or None,
        frequency_penalty=params.frequency_penalty or None,
    )
