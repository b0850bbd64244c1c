"""Greedy output from a cached prefix equals output computed from scratch, for every
cache family, in-process on the real engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.settings import WorkerSettings
from protocol.messages import AddRequest, ErrorEvent, FinishEvent, SamplingParams, TokenEvent
from tests.worker.tiny_models import make_tiny
from worker.engine import Engine
from worker.prefix_cache import PrefixCache

BLOCK = 32
SYSTEM = "You are a careful assistant. " + " ".join(f"Rule {i}: answer briefly about topic {i}." for i in range(25))


class Harness:
    """One engine on one model, run to completion request by request."""

    def __init__(self, loaded, *, cache: bool = True, budget: int = 1 << 30, chunk: int = 64, cold=None) -> None:
        self.events: list = []
        config = WorkerSettings(block_tokens=BLOCK, prefill_chunk_tokens=chunk, max_num_seqs=4)
        self.cache = PrefixCache(loaded.model, loaded.fingerprint, BLOCK, budget, enabled=cache, cold=cold)
        self.engine = Engine(loaded, config, self.events.append, self.cache)
        self._next = 0

    def submit(self, messages, max_tokens: int = 12, salt: str | None = None) -> str:
        self._next += 1
        rid = f"r{self._next}"
        self.engine.add(AddRequest(rid, messages=messages, cache_salt=salt,
                                   sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0)))
        return rid

    def run(self) -> None:
        while self.engine.has_work():
            self.engine.step()

    def result(self, rid: str) -> tuple[list[int], FinishEvent]:
        ids = [t for e in self.events if isinstance(e, TokenEvent) and e.request_id == rid for t in e.token_ids]
        (finish,) = [e for e in self.events if isinstance(e, (FinishEvent, ErrorEvent)) and e.request_id == rid]
        assert isinstance(finish, FinishEvent), finish
        return ids, finish

    def ask(self, messages, **kw) -> tuple[list[int], FinishEvent]:
        rid = self.submit(messages, **kw)
        self.run()
        return self.result(rid)


def chat(user: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


@pytest.fixture(scope="module", params=["llama", "gemma3_text", "lfm2"])
def tiny(request, default_model_dir: Path):
    return make_tiny(request.param, default_model_dir)


def test_hit_equals_scratch(tiny) -> None:
    h = Harness(tiny)
    first, f1 = h.ask(chat("What is topic 3?"))
    assert f1.usage.cached_tokens == 0
    second, f2 = h.ask(chat("What is topic 3?"))
    assert f2.usage.cached_tokens >= BLOCK * 4
    assert second == first


def test_divergence_mid_block_reuses_only_the_common_blocks(tiny) -> None:
    h = Harness(tiny)
    h.ask(chat("What is topic 3?"))
    fresh = Harness(tiny)
    other = chat("Tell me about topic 7 instead, please.")
    expected, _ = fresh.ask(other)
    got, finish = h.ask(other)
    assert got == expected
    prompt = finish.usage.prompt_tokens
    assert 0 < finish.usage.cached_tokens < prompt
    assert finish.usage.cached_tokens % BLOCK == 0


def test_four_concurrent_requests_sharing_a_prefix(tiny) -> None:
    questions = [chat(f"What is topic {i}?") for i in (1, 2, 3, 4)]
    alone = []
    for q in questions:
        alone.append(Harness(tiny).ask(q)[0])
    h = Harness(tiny)
    h.ask(chat("What is topic 9?"))  # warm the shared system prompt
    rids = [h.submit(q) for q in questions]
    h.run()
    results = [h.result(r) for r in rids]
    assert [ids for ids, _ in results] == alone
    assert all(f.usage.cached_tokens > 0 for _, f in results)


def test_multi_turn_hits_the_previous_turn(tiny) -> None:
    h = Harness(tiny)
    turn1 = chat("What is topic 5?")
    # 20 tokens: turn 1 ends inside the block after the prompt's last whole one, so the
    # point where turn 2's re-rendered history differs falls in turn 1's tail
    ids1, f1 = h.ask(turn1, max_tokens=20)
    answer = tiny.tokenizer.decode(ids1)
    turn2 = turn1 + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And topic 6?"}]
    expected, _ = Harness(tiny).ask(turn2)
    got, f2 = h.ask(turn2)
    assert got == expected
    # turn 2 resumes where turn 1 ended (whole blocks + the tail after them): it
    # recomputes only from the first token where the re-rendered history differs
    tok = tiny.tokenizer
    ids1 = _prompt_ids(tok, turn1) + ids1 + ([] if f1.finish_reason == "length" else [tok.eos_token_id])
    ids2 = _prompt_ids(tok, turn2)
    common = next((i for i, (a, b) in enumerate(zip(ids1, ids2)) if a != b), min(len(ids1), len(ids2)))
    if tiny.config["model_type"] == "llama":  # K/V can be cut anywhere
        assert common >= (len(ids1) // BLOCK) * BLOCK, "turn 2 differs before turn 1's tail: no tail to test"
        assert f2.usage.cached_tokens == min(common, len(ids2) - 1)
        assert f2.usage.cached_tokens > f1.usage.prompt_tokens
    else:  # snapshot layers: whole prompt blocks, or turn 1's whole tail when it matches
        assert (f1.usage.prompt_tokens // BLOCK) * BLOCK <= f2.usage.cached_tokens <= common


def _prompt_ids(tokenizer, messages) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def test_salts_never_share_blocks(tiny) -> None:
    h = Harness(tiny)
    h.ask(chat("What is topic 3?"), salt="tenant-a")
    _, other = h.ask(chat("What is topic 3?"), salt="tenant-b")
    assert other.usage.cached_tokens == 0
    _, same = h.ask(chat("What is topic 3?"), salt="tenant-a")
    assert same.usage.cached_tokens > 0


def test_hot_tier_stays_within_budget_and_counts_real_bytes(tiny) -> None:
    budget = 6 * _block_bytes(tiny)
    h = Harness(tiny, budget=budget)
    for i in range(6):
        h.ask(chat(f"Question {i}: " + "word " * (40 * i)), max_tokens=2)
        assert h.cache.hot.used_bytes <= budget
    real = sum(
        sum(a.nbytes for layer in payload.layers for a in layer.arrays)
        for payload, _ in h.cache.hot._entries.values()
    )
    assert real == h.cache.hot.used_bytes
    assert h.cache.hot.stats.evictions > 0


def _block_bytes(tiny) -> int:
    h = Harness(tiny)
    h.ask(chat("x"), max_tokens=1)
    payload, nbytes = next(iter(h.cache.hot._entries.values()))
    return nbytes


def test_a_shuffled_cached_block_changes_the_answer(default_model_dir: Path) -> None:
    """The tiny models' attention is sharp enough for the equality tests to mean something:
    the same hit with one cached block's keys reversed in token order (each value now
    under another token's key; reversing K and V together would change nothing, attention
    being a sum over (key, value) pairs) gives other greedy tokens than from scratch."""
    from dataclasses import replace

    import mlx.core as mx

    from protocol.block_keys import chain_keys
    from worker.kv_blocks import BlockPayload

    tiny = make_tiny("llama", default_model_dir)
    question = chat("What is topic 3?")
    scratch, _ = Harness(tiny, cache=False).ask(question, max_tokens=16)
    h = Harness(tiny)
    h.ask(question, max_tokens=16)
    ids = h.engine.questions.prompt_ids(AddRequest("probe", messages=question, sampling=SamplingParams()))
    key = chain_keys(tiny.fingerprint, ids, BLOCK, None)[2]
    payload, nbytes = h.cache.hot._entries[key]
    order = mx.array(list(range(BLOCK))[::-1])
    layers = tuple(replace(layer, arrays=(mx.take(layer.arrays[0], order, axis=-2), *layer.arrays[1:]))
                   for layer in payload.layers)
    h.cache.hot._entries[key] = (BlockPayload(layers, payload.nbytes), nbytes)
    shuffled, finish = h.ask(question, max_tokens=16)
    assert finish.usage.cached_tokens >= 4 * BLOCK
    assert shuffled != scratch, "attention too uniform: a misplaced cached block went unnoticed"
