"""A target model with its draft model, as one model to the engine: one cache list
(the target's layers, then the draft's), so the prefix cache keeps, restores and writes to
SSD both models' KV for a prefix as one block, and a turn that hits the target's prefix
never recomputes the draft's.

Why one model and not two engines: every path that fills a cache (a prefill chunk, the
rest of a prefix hit, a restored block) then fills the draft's with the same tokens in the
same call, and nothing else in the worker needs to know a draft exists. Only the decode
step (worker/speculative_batch.py) runs the two apart: the target alone on a plain step,
the draft alone while it drafts (worker/model_drafts.py).

The draft must share the target's tokenizer: a draft token is fed to the target as it is,
so a different vocabulary would verify nonsense. `check_same_vocabulary` refuses it at
load.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from worker.model_loader import LoadedModel


class DraftMismatch(ValueError):
    """The draft cannot draft for this target (another vocabulary)."""


class DraftedModel:
    """The target's forward pass that also runs the draft over the same tokens (see the
    module docstring). Attributes other than these are the target's own."""

    def __init__(self, target: nn.Module, draft: nn.Module) -> None:
        self.target = target
        self.draft = draft
        self.num_target_layers = len(make_prompt_cache(target))
        self._draft_runs = True

    @property
    def layers(self) -> list[Any]:
        return [*self.target.layers, *self.draft.layers]

    def make_cache(self) -> list[Any]:
        return make_prompt_cache(self.target) + make_prompt_cache(self.draft)

    def __call__(self, inputs: mx.array, cache: list[Any] | None = None, **kwargs: Any) -> mx.array:
        if cache is None:
            return self.target(inputs, **kwargs)
        target, draft = self.split(cache)
        logits = self.target(inputs, cache=target, **kwargs)
        if self._draft_runs and draft:
            self.draft(inputs, cache=draft)  # its KV only: the logits are never evaluated, so never computed
        return logits

    def split(self, cache: list[Any]) -> tuple[list[Any], list[Any]]:
        """(the target's layers, the draft's layers) of a cache list made by `make_cache`."""
        return cache[:self.num_target_layers], cache[self.num_target_layers:]

    def draft_logits(self, inputs: mx.array, cache: list[Any]) -> mx.array:
        """The draft alone over `inputs`, writing only the draft's layers of `cache`."""
        return self.draft(inputs, cache=self.split(cache)[1])

    @contextmanager
    def target_only(self) -> Iterator[None]:
        """Calls inside leave the draft's layers untouched (a decode step: the draft
        catches up on those tokens when it next drafts)."""
        self._draft_runs = False
        try:
            yield
        finally:
            self._draft_runs = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)


def check_same_vocabulary(target: LoadedModel, draft: LoadedModel) -> None:
    """Raise `DraftMismatch` unless `draft` maps every token text to the target's id and
    its output covers the target's ids."""
    target_vocab, draft_vocab = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if target_vocab != draft_vocab:
        differ = sorted(set(target_vocab.items()) ^ set(draft_vocab.items()), key=lambda kv: kv[1])
        sample = ", ".join(f"{text!r}={i}" for text, i in differ[:3])
        raise DraftMismatch(f"the draft's vocabulary differs from the target's ({len(draft_vocab)} tokens against "
                            f"{len(target_vocab)}; {len(differ)} entries differ, e.g. {sample}): a draft model must "
                            "share the target's tokenizer")
    target_size = int(target.config.get("vocab_size") or len(target_vocab))
    draft_size = int(draft.config.get("vocab_size") or len(draft_vocab))
    if draft_size < target_size:
        raise DraftMismatch(f"the draft's output has {draft_size} token ids, the target's {target_size}: "
                            "a draft model must score every token the target can produce")


def with_draft(target: LoadedModel, draft: LoadedModel) -> LoadedModel:
    """`target` as the engine serves it with `draft` drafting: the model is a
    `DraftedModel`, the weights count both, and the fingerprint names both (a block holds
    both models' KV, so it never meets a worker serving the target alone)."""
    check_same_vocabulary(target, draft)
    fingerprint = hashlib.blake2b(b"drafted:" + target.fingerprint + draft.fingerprint, digest_size=16).digest()
    return replace(target, model=DraftedModel(target.model, draft.model),
                   weights_bytes=target.weights_bytes + draft.weights_bytes,
                   load_time_s=target.load_time_s + draft.load_time_s, fingerprint=fingerprint)
