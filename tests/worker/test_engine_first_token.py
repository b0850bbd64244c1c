"""The first token leaves the engine in the step that samples it, not one step later.

BatchGenerator reports a sequence's first token only after dispatching the forward pass
for its second; on MLX's CPU stream that costs a whole decode step of TTFT, so the
engine sends it early. Same tokens, same finish, one step sooner.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.messages import FinishEvent, TokenEvent
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
    late.engine._early_first_token = False  # BatchGenerator's own timing
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
