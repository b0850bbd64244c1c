"""Clearing the hot tier between engine steps (`mlxd cache clear`) never changes a running
request's tokens, mid-prefill or mid-decode, for a sliceable and a snapshot-type model."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.messages import TokenEvent
from tests.worker.test_prefix_cache import Harness, chat
from tests.worker.tiny_models import make_tiny


@pytest.mark.parametrize("arch", ["llama", "lfm2"])
def test_clear_between_steps_keeps_running_requests_exact(arch: str, default_model_dir: Path) -> None:
    tiny = make_tiny(arch, default_model_dir)
    question = chat("What is topic 7?")
    expected, _ = Harness(tiny).ask(question, max_tokens=16, salt="scratch")

    h = Harness(tiny, chunk=32)  # one block per prefill step: the fresh request spans several
    h.ask(question, max_tokens=16, salt="warm")
    hit = h.submit(question, max_tokens=16, salt="warm")  # served from the hot tier
    fresh = h.submit(question, max_tokens=16, salt="fresh")  # still prefilling at the clear
    h.engine.step()
    assert not any(isinstance(e, TokenEvent) and e.request_id == fresh for e in h.events)  # mid-prefill
    num_blocks, num_bytes, num_dropped = h.cache.clear()
    assert num_blocks > 0 and num_bytes > 0 and num_dropped == 0
    assert len(h.cache.hot) == 0 and h.cache.hot.used_bytes == 0
    h.run()
    for rid in (hit, fresh):
        assert h.result(rid)[0] == expected, rid
    assert h.result(hit)[1].usage.cached_tokens > 0  # it had its hit before the clear

    assert h.ask(question, max_tokens=16, salt="warm")[0] == expected
