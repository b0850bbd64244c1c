"""How a prompt's uncached rest is prefilled: cut into block-aligned segments for the
batch, or, for a short rest after a prefix hit, run in one forward pass that samples the
first token."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.sample_utils import LogitsProcessor, Sampler


def prefill_segments(remainder: list[int], start: int, segment_tokens: int, block_tokens: int,
                     snapshots: bool) -> list[list[int]]:
    """Prefill pieces ending on block boundaries, so each block can be captured as it
    completes; `start` (the cached length) may sit inside a block after a tail hit.
    `snapshots`: the model has caches captured only at a segment's end."""
    if len(remainder) <= segment_tokens and not snapshots:
        # one step is enough; its whole blocks are captured when the request ends
        return [remainder]
    first = (-start) % block_tokens
    pieces = [remainder[:first]] if first else []
    pieces += [remainder[i : i + segment_tokens] for i in range(first, len(remainder), segment_tokens)]
    return [p for p in pieces if p]


def prefill_rest(model: nn.Module, prompt_ids: list[int], cached_tokens: int, caches: list[Any],
                 sampler: Sampler, processors: list[LogitsProcessor]) -> tuple[int, mx.array]:
    """Prefill the uncached rest of the prompt, last token included, in one forward
    pass over `caches`, and sample the first token from its logits; returns it with the
    distribution it was drawn from (normalized, after the processors: its logprobs).

    BatchGenerator prefills all but the last prompt token, then runs that token alone
    as the first decode step: a second forward pass, which on this hardware costs as
    much as the whole ~60-token rest of an agent's turn. Logits processors (a grammar's
    mask among them) see the prompt as context, as they would in the batch.
    """
    remainder = mx.array([prompt_ids[cached_tokens:]])
    logits = model(remainder, cache=caches)[:, -1, :]
    context = mx.array(prompt_ids)
    for processor in processors:
        logits = processor(context, logits)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    token = sampler(logprobs)
    mx.eval(token, logprobs, [c.state for c in caches])
    return int(token.item()), logprobs[0]
