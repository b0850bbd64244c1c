"""The first token leaves the engine as soon as it exists.

BatchGenerator reports a sequence's first token only after dispatching the forward pass
for its second; on MLX's CPU stream that costs a whole decode step of TTFT, so the
engine sends it early. A prefix hit's first token comes straight from the forward pass
over the uncached rest of its prompt. Same tokens, same finish, sooner.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.messages import AddRequest, FinishEvent, SamplingParams, TokenEvent
from tests.worker.test_prefix_cache import Harness, chat
from tests.worker.tiny_models import make_tiny


@pytest.fixture(scope="module")
def tiny(default_model_dir: Path):
    return make_tiny("llama", default_model_dir)


def _run_counting_steps(h: Harness, rid: str) -> tuple[int, list[int], FinishEvent]:
    """Steps until the request's first TokenEvent, then its tokens and finish."""
    steps, first_at = 0, None
    while h.engine.has_work():
        h.engine.step()
        steps += 1
        if first_at is None and any(isinstance(e, TokenEvent) and e.request_id == rid for e in h.events):
            first_at = steps
    ids, finish = h.result(rid)
    assert first_at is not None
    return first_at, ids, finish


@pytest.mark.parametrize("max_tokens", [12, 2])
def test_first_token_one_step_sooner_same_tokens(tiny, max_tokens: int) -> None:
    early = Harness(tiny, cache=False)
    late = Harness(tiny, cache=False)
    late.engine._early_first_token.enabled = False  # BatchGenerator's own timing
    messages = chat("What is topic 5?")
    early_step, early_ids, early_finish = _run_counting_steps(early, early.submit(messages, max_tokens=max_tokens))
    late_step, late_ids, late_finish = _run_counting_steps(late, late.submit(messages, max_tokens=max_tokens))
    assert early_step == late_step - 1
    assert early_ids == late_ids and len(early_ids) == max_tokens
    assert early_finish.finish_reason == late_finish.finish_reason == "length"
    assert early_finish.usage == late_finish.usage
    texts = [e.text for e in early.events if isinstance(e, TokenEvent)]
    assert "".join(texts) == tiny.tokenizer.decode(early_ids)


def test_a_single_token_request_waits_for_its_finish(tiny) -> None:
    """max_tokens=1: the token and the finish reason travel together, as before."""
    h = Harness(tiny, cache=False)
    rid = h.submit(chat("What is topic 6?"), max_tokens=1)
    h.run()
    ids, finish = h.result(rid)
    assert len(ids) == 1 and finish.finish_reason == "length"
    assert sum(isinstance(e, TokenEvent) for e in h.events) == 1


def test_concurrent_requests_keep_their_tokens(tiny) -> None:
    """Sequences joining a running batch: every stream equals its run alone."""
    prompts = [chat(f"Tell me about topic {i}.") for i in range(4)]
    alone = []
    for p in prompts:
        h = Harness(tiny, cache=False)
        alone.append(h.ask(p, max_tokens=10)[0])
    h = Harness(tiny, cache=False)
    rids = [h.submit(p, max_tokens=10) for p in prompts[:2]]
    h.engine.step()
    rids += [h.submit(p, max_tokens=10) for p in prompts[2:]]  # join mid-flight
    h.run()
    assert [h.result(r)[0] for r in rids] == alone


def _steps_to_first_token(h: Harness, rid: str) -> int:
    return _run_counting_steps(h, rid)[0]


def test_a_prefix_hit_samples_its_first_token_while_prefilling(tiny) -> None:
    """A hit with a short uncached rest: the rest, last token included, is one forward
    pass whose logits give the first token (no separate pass for the last prompt token).
    Same tokens as computing the whole prompt from scratch."""
    messages = chat("What is topic 7?")
    scratch = Harness(tiny, cache=False)
    want, want_finish = scratch.ask(messages, max_tokens=10)
    h = Harness(tiny)
    h.ask(messages, max_tokens=10)  # fills the cache
    rid = h.submit(messages, max_tokens=10)
    # the first token is out before any batch step
    assert [e for e in h.events if isinstance(e, TokenEvent) and e.request_id == rid]
    h.run()
    got, finish = h.result(rid)
    assert finish.usage.cached_tokens > 0
    assert got == want
    assert finish.finish_reason == want_finish.finish_reason and finish.usage.completion_tokens == 10
    assert finish.usage.prompt_tokens == want_finish.usage.prompt_tokens  # the prompt is not the cache


@pytest.mark.parametrize("max_tokens", [1, 2])
def test_a_hit_that_ends_at_once(tiny, max_tokens: int) -> None:
    messages = chat("What is topic 8?")
    h = Harness(tiny)
    full, _ = h.ask(messages, max_tokens=4)
    got, finish = h.ask(messages, max_tokens=max_tokens)
    assert finish.usage.cached_tokens > 0
    assert got == full[:max_tokens] and finish.finish_reason == "length"
    assert not h.engine.has_work()


def test_a_stop_string_in_the_first_token_of_a_hit(tiny) -> None:
    messages = chat("What is topic 9?")
    h = Harness(tiny)
    full, _ = h.ask(messages, max_tokens=4)
    first_text = tiny.tokenizer.decode(full[:1])
    assert first_text.strip(), "the tiny model's first token must carry text for this test"
    rid = h.submit(messages, max_tokens=4)  # a hit: its first token is out already
    h.engine.abort(rid)  # the client goes away: nothing of it stays in the engine
    assert not h.engine.has_work()
    h.events.clear()
    h.engine.add(AddRequest("stop1", messages=messages, sampling=SamplingParams(
        max_tokens=4, temperature=0.0, stop=[first_text.strip()])))
    h.run()
    ids, finish = h.result("stop1")
    assert finish.finish_reason == "stop"
    assert first_text.strip() not in "".join(e.text for e in h.events if isinstance(e, TokenEvent))
    assert not h.engine.has_work()


def test_a_hit_waits_its_turn_behind_queued_prompts(tiny) -> None:
    """While another prompt is still prefilling, a hit takes the normal FIFO path."""
    messages = chat("What is topic 10?")
    h = Harness(tiny)
    want, _ = h.ask(messages, max_tokens=6)
    other = h.submit(chat("Something entirely different " * 20), max_tokens=6)  # prefilling
    rid = h.submit(messages, max_tokens=6)
    assert not [e for e in h.events if isinstance(e, TokenEvent) and e.request_id == rid]
    h.run()
    assert h.result(rid)[0] == want
    assert h.result(other)[1].finish_reason == "length"


def test_one_fast_prefill_between_decode_steps(tiny) -> None:
    """Hits arriving together: one takes the fast path, the next waits for the batch, so
    running streams never wait more than one prefill chunk for their next token."""
    h = Harness(tiny)
    want = [h.ask(chat(f"What is topic {i}?"), max_tokens=6)[0] for i in (11, 12)]
    first = h.submit(chat("What is topic 11?"), max_tokens=6)
    second = h.submit(chat("What is topic 12?"), max_tokens=6)
    started = {e.request_id for e in h.events if isinstance(e, TokenEvent)}
    assert first in started and second not in started
    h.run()
    assert [h.result(first)[0], h.result(second)[0]] == want
