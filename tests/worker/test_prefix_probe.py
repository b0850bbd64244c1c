"""`PrefixCache.probe` in-process on the real engine, for every cache family: its split is
the `cached_tokens` of the request that follows (a miss, a hit with a tail, a later turn,
an SSD restore), and it uses nothing; and a snapshot's pins hold in the hot tier and
reach the SSD."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.messages import AddRequest, ProbeCache
from tests.worker.test_cold_tier import kvstore  # noqa: F401  (a fixture)
from tests.worker.test_prefix_cache import BLOCK, Harness, chat
from tests.worker.tiny_models import make_tiny
from worker.cold_tier import ColdTier

pytestmark = pytest.mark.timeout(300)


def probed(h: Harness, messages: list[dict]) -> tuple[int, int]:
    """(cached tokens, of them from the cold tier) as the probe predicts them."""
    found = h.engine.questions.probe_cache(ProbeCache(AddRequest("probe", messages=messages)))
    assert found.hot_tokens + found.cold_tokens <= found.prompt_tokens
    assert len(found.keys) == len(found.tiers) == found.prompt_tokens // BLOCK
    return found.hot_tokens + found.cold_tokens, found.cold_tokens


def served(h: Harness, messages: list[dict]) -> tuple[int, int]:
    _, finish = h.ask(messages, max_tokens=6)
    return finish.usage.cached_tokens, finish.usage.cold_tokens


@pytest.mark.parametrize("arch", ["llama", "gemma3_text", "lfm2"])
def test_the_probe_predicts_the_next_request(arch: str, default_model_dir: Path) -> None:
    h = Harness(make_tiny(arch, default_model_dir))
    first = chat("What is topic 3?")
    turn2 = [*first, {"role": "assistant", "content": "Topic 3 is about rules."}, {"role": "user", "content": "And 4?"}]
    for messages in (first, first, turn2, turn2, chat("Something else entirely?")):
        stats = h.cache.hot.stats
        before = (stats.hits, stats.misses, list(h.cache.hot._entries))
        prediction = probed(h, messages)
        assert (stats.hits, stats.misses, list(h.cache.hot._entries)) == before, "the probe used the hot tier"
        assert served(h, messages) == prediction, messages[-1]


@pytest.mark.parametrize("arch", ["llama", "lfm2"])
def test_cold_split_and_pins_with_a_kvstore(arch: str, kvstore: str, default_model_dir: Path) -> None:  # noqa: F811
    tiny = make_tiny(arch, default_model_dir)
    question = chat("What is topic 5?")
    writer = Harness(tiny, cold=ColdTier(kvstore, f"probe-{arch}"))
    cold, writer.cache.cold = writer.cache.cold, None
    writer.ask(question)  # computed with the cold tier out of the way: only the hot tier has its blocks
    writer.cache.cold = cold
    found = writer.engine.questions.probe_cache(ProbeCache(AddRequest("p", messages=question)))
    keys = found.keys
    assert found.cold_tier == "ok" and not any(found.in_cold_tier) and set(found.tiers) == {"hot"}
    pinned = writer.cache.pin("snap", keys)
    assert pinned.hot_blocks == len(keys) and pinned.hot_bytes > 0
    stored = writer.cache.store_pinned(keys)  # writes what the kvstore lacks, and flushes
    assert stored.flushed and stored.missing_blocks == 0 and stored.written_blocks == len(keys)
    assert writer.cache.store_pinned(keys).written_blocks == 0  # now it has them all
    assert writer.cache.cold.probe(keys) == [True] * len(keys)
    assert writer.cache.stats()["snapshots"] == {"snap": [len(keys), pinned.hot_bytes]}
    writer.cache.clear()
    assert all(k in writer.cache.hot for k in keys) and len(writer.cache.hot) == len(keys)  # a clear keeps pins
    writer.cache.cold.close()

    reader = Harness(tiny, cold=ColdTier(kvstore, f"probe-{arch}"))  # as after a restart
    cached, cold = probed(reader, question)
    assert cold >= 4 * BLOCK and cached == cold  # no tail survives a restart
    found = reader.engine.questions.probe_cache(ProbeCache(AddRequest("p", messages=question)))
    assert found.tiers == ["cold"] * len(keys) and found.in_cold_tier == [True] * len(keys) and found.keys == keys
    assert served(reader, question) == (cached, cold)
    assert probed(reader, question)[1] == 0  # hot again
    reader.cache.cold.close()
