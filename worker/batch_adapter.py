"""mlx-lm's BatchGenerator as the engine uses it, and every reach into its internals.

COUPLED TO MLX-LM'S PRIVATE FIELDS: `BatchGenerator._generation_batch` (which
`install_speculation` replaces with worker/speculative_batch.py's subclass) and that batch's
`uids`, `prompt_cache`, `logits_processors` (which `take_processors` edits),
`_current_tokens`, `_next_tokens` and `_next_logprobs` (checked against mlx-lm 0.32.2).
Nothing else in worker/ may touch a private attribute of BatchGenerator or its batches.
If mlx-lm renames or reshapes them, `peek_sampled_token`, `decoding_rows` and
`decode_step_uids` return None and `take_processors` takes nothing, which only turns the
early first token and the batched grammar masks off, and tests/worker/test_batch_adapter.py
fails naming the field that changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import BatchGenerator

from worker.model_drafts import ModelDrafter
from worker.prompt_lookup import DraftLength
from worker.speculative_batch import SpeculativeBatch

CHECKED_MLX_LM_VERSION = "0.32.2"


def make_batch_generator(model: nn.Module, eos_token_ids: list[int], max_num_seqs: int,
                         prefill_chunk_tokens: int,
                         held: Callable[[int], Any] | None = None,
                         drafter: ModelDrafter | None = None) -> BatchGenerator:
    """A generator that decodes up to `max_num_seqs` sequences at once, prefills waiting
    prompts together in chunks of `prefill_chunk_tokens`, and stops a sequence at any
    single EOS token; with `held` (a uid's grammar processor, if one masks it), its decode
    steps can verify drafts (`install_speculation`), the draft model's too with `drafter`."""
    generator = BatchGenerator(
        model,
        stop_tokens=[[t] for t in eos_token_ids],
        completion_batch_size=max_num_seqs,
        prefill_batch_size=max_num_seqs,
        prefill_step_size=prefill_chunk_tokens,
    )
    if held is not None:
        install_speculation(generator, eos_token_ids, held, drafter)
    return generator


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


def sampled_logprobs(generator: BatchGenerator, uid: int) -> mx.array | None:
    """The distribution `sampled_token` was drawn from (the row the next step reports as
    its `logprobs`), or None while `uid` is not decoding; raises as `sampled_token` does."""
    batch = generator._generation_batch
    if uid not in batch.uids:
        return None
    row = batch._next_logprobs[batch.uids.index(uid)]
    if not isinstance(row, mx.array):
        raise TypeError(f"_next_logprobs holds {type(row).__name__}, not arrays")
    return row


def peek_sampled_token(generator: BatchGenerator, uid: int,
                       with_logprobs: bool = False) -> tuple[int, mx.array | None] | None:
    """`sampled_token` (and, `with_logprobs`, its `sampled_logprobs`), or None when
    mlx-lm's internals have changed: callers use it for an optimisation that can be
    switched off, never for correctness."""
    try:
        token = sampled_token(generator, uid)
        row = sampled_logprobs(generator, uid) if with_logprobs and token is not None else None
    except (AttributeError, ValueError, IndexError, TypeError):
        return None
    if token is None or (with_logprobs and row is None):
        return None
    return token, row


def decoding_rows(generator: BatchGenerator) -> tuple[list[Any], mx.array] | None:
    """Each decoding sequence's logits processors, row by row, and the tokens the step
    now running feeds in (row `e`'s processors see `tokens[e]` appended to their context
    in this step), or None when mlx-lm's internals have changed. Valid only while that
    batch's step calls its processors."""
    try:
        batch = generator._generation_batch
        processors = batch.logits_processors
        tokens = batch._current_tokens
        uids = batch.uids
    except AttributeError:
        return None
    if not isinstance(tokens, mx.array) or tokens.ndim != 1:
        return None
    if not isinstance(processors, list) or not len(processors) == len(uids) == tokens.shape[0]:
        return None
    return processors, tokens


def take_processors(generator: BatchGenerator, select: Callable[[Any], bool]) -> list[tuple[int, Any]]:
    """Remove every processor `select` picks from the decoding rows' processor lists, so
    mlx-lm no longer calls it, and return them as (uid, processor); [] when mlx-lm's
    internals have changed (then every processor stays where it was)."""
    rows = decoding_rows(generator)
    if rows is None:
        return []
    processors, _ = rows
    uids = generator._generation_batch.uids
    taken = []
    for row, procs in enumerate(processors):
        picked = [p for p in procs or () if select(p)]
        if picked:
            taken.extend((uids[row], p) for p in picked)
            processors[row] = tuple(p for p in procs if p not in picked)
    return taken


def decode_step_uids(generator: BatchGenerator, cache: Any) -> list[int] | None:
    """The uids of the generation batch's rows, in row order, when a model call with
    `cache` is that batch's decode step (its `_step`); None for any other call (a
    prefill chunk, a new sequence's first step) or when mlx-lm's internals have changed."""
    try:
        batch = generator._generation_batch
        if cache is None or cache is not batch.prompt_cache:
            return None
        return list(batch.uids)
    except AttributeError:
        return None


def install_speculation(generator: BatchGenerator, eos_token_ids: list[int], held: Callable[[int], Any],
                        drafter: ModelDrafter | None = None) -> SpeculativeBatch | None:
    """Put a `SpeculativeBatch` in place of the generator's empty generation batch, or
    None (nothing replaced) when mlx-lm's internals have changed."""
    try:
        batch = SpeculativeBatch.replacing(generator._generation_batch, eos_token_ids=eos_token_ids,
                                           held=held, drafter=drafter)
    except (AttributeError, TypeError, ValueError):
        return None
    generator._generation_batch = batch
    return batch


def want_drafts(generator: BatchGenerator, uid: int, length: DraftLength, use_model: bool = False) -> bool:
    """Let `uid` speculate, `length` long (`use_model`: from the draft model too, where
    there is one); False when the generator has no speculative batch (not installed, or
    mlx-lm's internals have changed)."""
    batch = getattr(generator, "_generation_batch", None)
    if not isinstance(batch, SpeculativeBatch):
        return False
    batch.want(uid, length, use_model)
    return True
