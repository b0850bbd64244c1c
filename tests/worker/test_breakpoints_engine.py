"""Cache breakpoints in the real engine, in-process, on tiny models of a sliceable and a
snapshot cache family with the real tokenizer: a request's breakpoints pin their whole
blocks in a small hot tier through other traffic (the same prompt without one is evicted),
a hit refreshes them, and its usage splits the prompt into read, written and the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.block_keys import chain_keys
from protocol.cache_breakpoints import TTL_1H_S, CacheBreakpoint
from protocol.messages import AddRequest, FinishEvent, PromptEvent, SamplingParams
from tests.worker.test_prefix_cache import BLOCK, Harness
from tests.worker.tiny_models import make_tiny

HOT_BLOCKS = 12  # the hot tier's budget, in blocks


def system_text(seed: int) -> str:
    return f"Prompt {seed}. " + " ".join(f"Rule {seed}-{i}: answer briefly about topic {i + seed}." for i in range(12))


def request(rid: str, seed: int, points: list[CacheBreakpoint], question: str = "What is topic 3?") -> AddRequest:
    return AddRequest(rid, messages=[{"role": "system", "content": system_text(seed)},
                                     {"role": "user", "content": question}],
                      sampling=SamplingParams(max_tokens=2, temperature=0.0), cache_breakpoints=points)


def finish_of(h: Harness, rid: str) -> FinishEvent:
    (finish,) = [e for e in h.events if isinstance(e, FinishEvent) and e.request_id == rid]
    return finish


def send(h: Harness, add: AddRequest) -> FinishEvent:
    h.engine.add(add)
    h.run()
    return finish_of(h, add.request_id)


@pytest.fixture(scope="module", params=["llama", "lfm2"])
def tiny(request: pytest.FixtureRequest, default_model_dir: Path):
    return make_tiny(request.param, default_model_dir)


@pytest.fixture
def harness(tiny) -> Harness:
    """An engine whose hot tier holds HOT_BLOCKS blocks of this model."""
    probe = Harness(tiny)
    send(probe, request("measure", 0, []))
    block_bytes = max(probe.cache.hot.nbytes(k) or 0 for k in probe.cache.hot._entries)
    return Harness(tiny, budget=HOT_BLOCKS * block_bytes)


def flood(h: Harness, start: int, count: int = 6) -> None:
    for seed in range(start, start + count):
        send(h, request(f"other-{seed}", seed, []))


def system_keys(h: Harness, add: AddRequest, num_tokens: int) -> list[bytes]:
    ids = h.engine.questions.prompt_ids(add)
    return chain_keys(h.cache.fingerprint, ids, BLOCK, None)[: num_tokens // BLOCK]


def test_a_breakpoint_pins_its_prefix_through_other_traffic(harness: Harness) -> None:
    h = harness
    # the negative control: unmarked, the same traffic evicts it
    plain = send(h, request("plain-1", 100, []))
    assert plain.usage.cache_creation_tokens == 0
    flood(h, 200)
    assert send(h, request("plain-2", 100, [])).usage.cached_tokens == 0

    marked = request("marked-1", 300, [CacheBreakpoint(message_index=0)])
    (position,) = h.engine._admitter.breakpoints(marked, h.engine.questions.prompt_ids(marked))
    keys = system_keys(h, marked, position.tokens)
    assert len(keys) >= 3
    first = send(h, marked)
    assert (first.usage.cached_tokens, first.usage.cache_creation_tokens) == (0, position.tokens)
    assert all(h.cache.hot.is_pinned(k) and k in h.cache.hot for k in keys)
    flood(h, 400)
    again = send(h, request("marked-2", 300, [CacheBreakpoint(message_index=0)], "And topic 4?"))
    assert again.usage.cached_tokens >= len(keys) * BLOCK
    assert again.usage.cache_creation_tokens == max(0, position.tokens - again.usage.cached_tokens)
    prompt_event = next(e for e in h.events if isinstance(e, PromptEvent) and e.request_id == "marked-2")
    assert prompt_event.cache_creation_tokens == again.usage.cache_creation_tokens
    assert h.cache.stats()["breakpoint_prefixes"] == 1
    assert h.cache.stats()["breakpoint_pinned_bytes"] <= h.cache.hot.budget_bytes // 2


def test_a_hit_refreshes_the_ttl_and_expiry_unpins(harness: Harness) -> None:
    h = harness
    pins = h.cache.breakpoint_pins
    now = [0.0]
    pins.clock = lambda: now[0]
    marked = request("m1", 500, [CacheBreakpoint(TTL_1H_S, message_index=0)])
    send(h, marked)
    (held,) = pins.held.values()
    assert held.expires_at == TTL_1H_S
    now[0] = 3000.0
    send(h, request("m2", 500, [CacheBreakpoint(message_index=0)], "Why?"))  # a 5-minute hit: no shorter
    assert held.expires_at == TTL_1H_S
    send(h, request("m3", 500, [CacheBreakpoint(TTL_1H_S, message_index=0)], "How?"))
    assert held.expires_at == 3000.0 + TTL_1H_S
    now[0] = 3000.0 + TTL_1H_S
    assert h.cache.stats()["breakpoint_prefixes"] == 0 and h.cache.hot.pinned_bytes == 0


def test_usage_splits_the_prompt_by_breakpoint_and_ttl(harness: Harness) -> None:
    h = harness
    points = [CacheBreakpoint(TTL_1H_S, message_index=0, content_chars=40), CacheBreakpoint(message_index=1)]
    add = request("split-1", 600, points)
    early, late = h.engine._admitter.breakpoints(add, h.engine.questions.prompt_ids(add))
    assert 0 < early.tokens < late.tokens < len(h.engine.questions.prompt_ids(add))
    usage = send(h, add).usage
    assert (usage.cached_tokens, usage.cache_creation_tokens, usage.cache_creation_1h_tokens) == (
        0, late.tokens, early.tokens)
    usage = send(h, request("split-2", 600, points)).usage  # the same again: read, nothing new written
    assert usage.cached_tokens >= late.tokens // BLOCK * BLOCK
    assert usage.cache_creation_tokens == max(0, late.tokens - usage.cached_tokens)
    assert usage.cache_creation_1h_tokens == 0


def test_with_the_prefix_cache_off_nothing_is_pinned_or_written(tiny) -> None:
    h = Harness(tiny, cache=False)
    usage = send(h, request("off", 700, [CacheBreakpoint(message_index=0)])).usage
    assert (usage.cached_tokens, usage.cache_creation_tokens) == (0, 0) and not h.cache.breakpoint_pins.held
