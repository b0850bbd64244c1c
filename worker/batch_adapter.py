"""mlx-lm's BatchGenerator as the engine uses it, and every reach into its internals.

COUPLED TO MLX-LM'S PRIVATE FIELDS: `BatchGenerator._generation_batch` and that batch's
`uids` and `_next_tokens` (checked against mlx-lm 0.32.2). Nothing else in worker/ may
touch a private attribute of BatchGenerator or its batches. If mlx-lm renames or reshapes
them, `peek_sampled_token` returns None, which only turns the early first token off, and
tests/worker/test_batch_adapter.py fails naming the field that changed.
"""

from __future__ import annotations

import mlx.nn as nn
from mlx_lm.generate import BatchGenerator

CHECKED_MLX_LM_VERSION = "0.32.2"


def make_batch_generator(model: nn.Module, eos_token_ids: list[int], max_num_seqs: int,
                         prefill_chunk_tokens: int) -> BatchGenerator:
    """A generator that decodes up to `max_num_seqs` sequences at once, prefills waiting
    prompts together in chunks of `prefill_chunk_tokens`, and stops a sequence at any
    single EOS token."""
    return BatchGenerator(
        model,
        stop_tokens=[[t] for t in eos_token_ids],
        completion_batch_size=max_num_seqs,
        prefill_batch_size=max_num_seqs,
        prefill_step_size=prefill_chunk_tokens,
    )


def sampled_token(generator: BatchGenerator, uid: int) -> int | None:
    """The token sampled for `uid` in the generation batch but not reported yet (it is
    reported with the next step), or None while `uid` is not decoding.

    Reads private fields; raises AttributeError, TypeError or IndexError if mlx-lm's
    internals no longer have the shape this module was written against.
    """
    batch = generator._generation_batch
    if uid not in batch.uids:
        return None
    return int(batch._next_tokens[batch.uids.index(uid)].item())


def peek_sampled_token(generator: BatchGenerator, uid: int) -> int | None:
    """`sampled_token`, or None when mlx-lm's internals have changed: callers use it for
    an optimisation that can be switched off, never for correctness."""
    try:
        return sampled_token(generator, uid)
    except (AttributeError, ValueError, IndexError, TypeError):
        return None
