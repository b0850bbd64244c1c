"""Damage a tiny model's cached blocks in place, for negative controls: "a hit equals
scratch" means something only if the same hit from a damaged cache gives other tokens."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import mlx.core as mx

from protocol.block_keys import BlockKey, chain_keys
from protocol.messages import AddRequest, SamplingParams
from tests.worker.test_prefix_cache import BLOCK, Harness
from worker.kv_blocks import SLICE, SNAPSHOT, BlockPayload, LayerBlock
from worker.model_loader import LoadedModel

LayerChange = Callable[[LayerBlock], LayerBlock]


def reverse_keys(layer: LayerBlock) -> LayerBlock:
    """An attention layer's keys in reverse token order (each value now under another
    token's key; reversing K and V together would change nothing, attention being a sum
    over (key, value) pairs). Snapshot layers are left as they are."""
    if layer.kind != SLICE:
        return layer
    order = mx.array(list(range(layer.arrays[0].shape[-2]))[::-1])
    return replace(layer, arrays=(mx.take(layer.arrays[0], order, axis=-2), *layer.arrays[1:]))


def negate_keys(layer: LayerBlock) -> LayerBlock:
    """An attention layer's keys negated (as test_cache_negative_control does on SmolLM2)."""
    if layer.kind != SLICE:
        return layer
    return replace(layer, arrays=(-layer.arrays[0], *layer.arrays[1:]))


def zero_state(layer: LayerBlock) -> LayerBlock:
    """A snapshot layer's state zeroed: what a restore that lost a conv state would give
    (the state of a sequence that starts there). Sliced layers are left as they are."""
    if layer.kind != SNAPSHOT:
        return layer
    return replace(layer, arrays=tuple(mx.zeros_like(a) for a in layer.arrays))


def damage(h: Harness, keys: list[BlockKey], change: LayerChange) -> None:
    """Apply `change` to every layer of the hot-tier blocks stored under `keys`."""
    for key in keys:
        payload, nbytes = h.cache.hot._entries[key]
        h.cache.hot._entries[key] = (BlockPayload(tuple(change(layer) for layer in payload.layers), payload.nbytes),
                                     nbytes)


def prompt_keys(h: Harness, messages: list[dict]) -> list[BlockKey]:
    """The block keys of this prompt's whole blocks, as the engine chains them."""
    ids = h.engine.questions.prompt_ids(AddRequest("probe", messages=messages, sampling=SamplingParams()))
    return chain_keys(h.cache.fingerprint, ids, BLOCK, None)


@dataclass
class Answers:
    scratch: list[int]  # greedy tokens without a cache
    hit: list[int]  # the same prompt, hit from the cache as stored
    damaged: list[int]  # and hit again once damaged
    cached_tokens: int  # of the damaged hit


def answer_from_damaged_cache(tiny: LoadedModel, messages: list[dict],
                              blocks: Callable[[list[BlockKey]], list[BlockKey]], change: LayerChange,
                              max_tokens: int = 16) -> Answers:
    """Greedy tokens from scratch, from a cache hit, and from the same hit once the
    blocks picked by `blocks` (from the prompt's keys) are damaged by `change`."""
    scratch, _ = Harness(tiny, cache=False).ask(messages, max_tokens=max_tokens)
    h = Harness(tiny)
    h.ask(messages, max_tokens=max_tokens)
    hit, _ = h.ask(messages, max_tokens=max_tokens)
    damage(h, blocks(prompt_keys(h, messages)), change)
    damaged, finish = h.ask(messages, max_tokens=max_tokens)
    return Answers(scratch, hit, damaged, finish.usage.cached_tokens)
