"""When sequences finish, which comes first: their last tokens or their cache captures.

A capture waits for the decode step already dispatched and then slices the cache. A lone
finisher is captured before its last token leaves, so a client answering at once finds
its whole conversation cached; several finishing in one step have their tokens sent
first (the worker's `flush`), so none of them waits for the others' captures.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.settings import WorkerSettings
from protocol.messages import AddRequest, SamplingParams
from tests.worker.test_prefix_cache import BLOCK, chat
from tests.worker.tiny_models import make_tiny
from worker.engine import Engine
from worker.prefix_cache import PrefixCache


@pytest.fixture(scope="module")
def tiny(default_model_dir: Path):
    return make_tiny("llama", default_model_dir)


class Recorder:
    """The engine's outbox and its prefix cache's captures, in one timeline."""

    def __init__(self, loaded) -> None:
        self.timeline: list[str] = []
        self.held: list = []
        config = WorkerSettings(block_tokens=BLOCK, max_num_seqs=4)
        self.cache = PrefixCache(loaded.model, loaded.fingerprint, BLOCK, 1 << 30, enabled=True, cold=None)
        capture_final = self.cache.capture_final

        def recorded_capture(plan, caches, tokens) -> None:
            self.timeline.append("capture")
            capture_final(plan, caches, tokens)

        self.cache.capture_final = recorded_capture  # type: ignore[method-assign]
        self.engine = Engine(loaded, config, self.held.append, self.cache, flush=self.flush)

    def flush(self) -> None:
        self.timeline += [f"sent {type(e).__name__}" for e in self.held]
        self.held.clear()

    def step_all(self) -> None:
        while self.engine.has_work():
            self.engine.step()
            self.flush()  # the worker sends what is left at the end of every step


def add(engine: Engine, rid: str, topic: str, max_tokens: int) -> None:
    engine.add(AddRequest(rid, messages=chat(f"Tell me about {topic}."),
                          sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0)))


def test_several_finishing_together_send_their_tokens_before_capturing(tiny) -> None:
    r = Recorder(tiny)
    for i, topic in enumerate(["rivers", "owls", "salt"]):
        add(r.engine, f"r{i}", topic, max_tokens=6)
    r.step_all()
    finishes = [i for i, e in enumerate(r.timeline) if e == "sent FinishEvent"]
    captures = [i for i, e in enumerate(r.timeline) if e == "capture"]
    assert len(finishes) == 3 and len(captures) == 3
    assert max(finishes) < min(captures)


def test_a_lone_finisher_is_captured_before_its_last_token_leaves(tiny) -> None:
    r = Recorder(tiny)
    add(r.engine, "solo", "rivers", max_tokens=6)
    r.step_all()
    assert r.timeline.index("capture") < r.timeline.index("sent FinishEvent")
    # and the next turn, arriving at once, is served from that capture
    before = r.cache.stats()["hits"]
    add(r.engine, "next", "rivers", max_tokens=2)
    r.step_all()
    assert r.cache.stats()["hits"] > before
