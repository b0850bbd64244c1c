"""The cache-equality tests can fail: on the real model, a hit equals scratch, and the same
hit with one cached block perturbed does not. So "hit == scratch" passes because the cached
K/V are right, not because the answer ignores them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import pytest

from protocol.block_keys import chain_keys
from protocol.messages import AddRequest, SamplingParams
from tests.worker.test_prefix_cache import BLOCK, Harness, chat
from worker.kv_blocks import BlockPayload
from worker.model_loader import load_for_serving

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def real(default_model_dir: Path):
    return load_for_serving(default_model_dir)


def perturbed(payload: BlockPayload) -> BlockPayload:
    """The block with its keys negated in every layer: still well-formed, wrong values."""
    layers = tuple(replace(layer, arrays=(-layer.arrays[0], *layer.arrays[1:])) for layer in payload.layers)
    return BlockPayload(layers, payload.nbytes)


def test_a_perturbed_block_changes_the_answer(real) -> None:
    question = chat("What is topic 3? Answer in one sentence.")
    scratch, _ = Harness(real, cache=False).ask(question, max_tokens=16)

    h = Harness(real)
    h.ask(question, max_tokens=16)
    hit, finish = h.ask(question, max_tokens=16)
    assert finish.usage.cached_tokens >= 4 * BLOCK
    assert hit == scratch  # the positive: served from cache, same tokens

    # the negative control: the same hit, one early block of it wrong
    ids = h.engine.prompt_ids(AddRequest("probe", messages=question, sampling=SamplingParams()))
    key = chain_keys(real.fingerprint, ids, BLOCK, None)[1]
    payload, nbytes = h.cache.hot._entries[key]
    h.cache.hot._entries[key] = (perturbed(payload), nbytes)
    mx.eval([layer.arrays for layer in h.cache.hot._entries[key][0].layers])
    wrong, finish = h.ask(question, max_tokens=16)
    assert finish.usage.cached_tokens >= 4 * BLOCK  # the perturbed block was used
    assert wrong != scratch, "a wrong cached block went unnoticed: the equality test could not fail"
