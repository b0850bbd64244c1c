"""Cut a sequence's per-layer mlx-lm caches into block payloads, and build caches back.

Attention layers (`KVCache`) are sliced by token: a block holds that block's K and V.
Caches that cannot be sliced by token (rotating windows, SSM / linear-attention
`ArraysCache`, ...) are stored as a full-state snapshot taken exactly at the block's end
boundary. Restoring a run of blocks concatenates the slices and takes the snapshots of
the run's last block.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache, make_prompt_cache

log = logging.getLogger(__name__)

SLICE = "slice"
SNAPSHOT = "snapshot"


@dataclass(frozen=True)
class LayerBlock:
    """One layer's share of a block: K/V slices, or the layer's whole state."""

    kind: str
    arrays: tuple[mx.array, ...]
    scalars: tuple[Any, ...] = ()  # snapshot only: state entries that are not arrays


@dataclass(frozen=True)
class BlockPayload:
    layers: tuple[LayerBlock, ...]
    nbytes: int


def layer_kinds(model: nn.Module) -> list[str] | None:
    """How each layer's cache is captured, or None if some layer cannot be (served
    uncached). Probed on a fresh cache, once per model."""
    kinds = []
    for cache in make_prompt_cache(model):
        if type(cache) is KVCache:
            kinds.append(SLICE)
            continue
        try:
            _flatten_state(cache.state, [])
        except Exception:  # a cache class without a usable state
            return None
        kinds.append(SNAPSHOT)
    return kinds


def _flatten_state(obj: Any, arrays: list[mx.array]) -> Any:
    """State tree -> a msgpack-able layout, collecting (copies of) its arrays in order."""
    if isinstance(obj, mx.array):
        arrays.append(mx.array(obj))
        return ["a", len(arrays) - 1]
    if isinstance(obj, (list, tuple)):
        return ["l" if isinstance(obj, list) else "t", [_flatten_state(x, arrays) for x in obj]]
    if obj is None or isinstance(obj, (int, float, str, bool)):
        return ["s", obj]
    raise TypeError(f"cache state holds a {type(obj).__name__}")


def _rebuild_state(layout: Any, arrays: tuple[mx.array, ...]) -> Any:
    kind, value = layout
    if kind == "a":
        return mx.array(arrays[value])  # the request's own copy: stored blocks stay as they are
    if kind == "s":
        return value
    items = [_rebuild_state(x, arrays) for x in value]
    return items if kind == "l" else tuple(items)


def _snapshot(cache: Any) -> LayerBlock:
    arrays: list[mx.array] = []
    layout = _flatten_state(cache.state, arrays)
    return LayerBlock(SNAPSHOT, tuple(arrays), (layout,))


def _snapshots(caches: list[Any], kinds: list[str]) -> dict[int, LayerBlock]:
    return {i: _snapshot(c) for i, (c, k) in enumerate(zip(caches, kinds)) if k == SNAPSHOT}


def positions_held(caches: list[Any], most: int) -> int:
    """How many positions every sliceable layer of a sequence's caches holds, at most
    `most` (a draft model's layers can trail the target's, worker/model_drafts.py)."""
    return min([most, *(int(c.offset) for c in caches if type(c) is KVCache)])


def slice_span(caches: list[Any], kinds: list[str], start: int, end: int,
               snapshots: dict[int, LayerBlock] | None = None) -> BlockPayload:
    """Payload of tokens [start, end) of one sequence's caches (batch size 1).

    Snapshot layers hold the state at the cache's current position, so `end` must be
    that position whenever the model has any (callers make sure of it)."""
    if snapshots is None:
        snapshots = _snapshots(caches, kinds)
    layers = []
    for i, (cache, kind) in enumerate(zip(caches, kinds)):
        if kind == SLICE:
            keys = mx.array(cache.keys[..., start:end, :])
            values = mx.array(cache.values[..., start:end, :])
            layers.append(LayerBlock(SLICE, (keys, values)))
        else:
            layers.append(snapshots[i])
    arrays = [x for layer in layers for x in layer.arrays]
    mx.eval(arrays)
    return BlockPayload(tuple(layers), sum(x.nbytes for x in arrays))


def slice_blocks(caches: list[Any], kinds: list[str], start: int, end: int, block_tokens: int) -> list[BlockPayload]:
    """Payloads of whole blocks [start, end): more than one only for models whose layers
    are all sliceable (callers keep prefill segments one block long otherwise)."""
    snapshots = _snapshots(caches, kinds)
    return [
        slice_span(caches, kinds, b * block_tokens, (b + 1) * block_tokens, snapshots)
        for b in range(start, end)
    ]


def trim_payload(payload: BlockPayload, num_tokens: int) -> BlockPayload:
    """The first `num_tokens` tokens of a sliceable payload (a view, for assembling)."""
    layers = tuple(
        LayerBlock(SLICE, tuple(a[..., :num_tokens, :] for a in layer.arrays)) for layer in payload.layers
    )
    return BlockPayload(layers, payload.nbytes)


def assemble(model: nn.Module, blocks: list[BlockPayload]) -> list[Any]:
    """A fresh per-layer cache holding the prefix covered by `blocks` (in order)."""
    caches = make_prompt_cache(model)
    last = blocks[-1]
    for i, cache in enumerate(caches):
        layer = last.layers[i]
        if layer.kind == SLICE:  # a KVCache (see layer_kinds)
            keys = mx.concatenate([blk.layers[i].arrays[0] for blk in blocks], axis=2)
            values = mx.concatenate([blk.layers[i].arrays[1] for blk in blocks], axis=2)
            cache.state = (keys, values, keys.shape[2])
        else:
            cache.state = _rebuild_state(layer.scalars[0], layer.arrays)
    return caches
