"""Restores from a real kvstore process equal computation from scratch, for a sliceable
(llama), a rotating-window (gemma3_text: RotatingKVCache + KVCache) and a state-space
(lfm2: ArraysCache + KVCache) model."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol.messages import AddRequest, SamplingParams
from protocol.sockets import ipc_address
from tests.worker.test_prefix_cache import BLOCK, Harness, chat
from tests.worker.tiny_models import make_tiny
from worker.cold_tier import ColdTier

pytestmark = pytest.mark.timeout(120)


@pytest.fixture()
def kvstore(tmp_path: Path) -> Iterator[str]:
    runtime = Path(tempfile.mkdtemp(prefix="kvt-", dir="/tmp"))
    address = ipc_address(runtime, "kv")
    proc = subprocess.Popen([sys.executable, "-m", "kvstore", "--bind", address, "--root", str(tmp_path / "kv")])
    deadline = time.monotonic() + 30
    while not (runtime / "kv").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "kvstore did not start"
        time.sleep(0.05)
    yield address
    proc.terminate()
    proc.wait(timeout=30)


@pytest.mark.parametrize("arch", ["llama", "gemma3_text", "lfm2"])  # KV, rotating window, conv state
def test_restore_from_ssd_equals_scratch(arch: str, kvstore: str, default_model_dir: Path) -> None:
    tiny = make_tiny(arch, default_model_dir)
    question = chat("What is topic 4?")
    writer = Harness(tiny, cold=ColdTier(kvstore, f"tiny-{arch}"))
    expected, first = writer.ask(question)
    assert first.usage.cached_tokens == 0
    assert writer.cache.cold.flush()
    writer.cache.cold.close()

    # a new engine (as after a worker restart): empty hot tier, same kvstore
    reader = Harness(tiny, cold=ColdTier(kvstore, f"tiny-{arch}"))
    got, second = reader.ask(question)
    assert got == expected
    assert second.usage.cold_tokens >= 4 * BLOCK
    assert second.usage.cached_tokens >= second.usage.cold_tokens
    reader.cache.cold.close()


def test_a_dead_kvstore_is_a_miss_not_a_failure(default_model_dir: Path) -> None:
    tiny = make_tiny("llama", default_model_dir)
    nowhere = ipc_address(Path(tempfile.mkdtemp(prefix="kvt-", dir="/tmp")), "none")
    h = Harness(tiny, cold=ColdTier(nowhere, "tiny"))
    ids, finish = h.ask(chat("What is topic 4?"))
    assert ids and finish.usage.cold_tokens == 0
    h.cache.cold.close()


def test_two_models_never_read_each_others_blocks(kvstore: str, default_model_dir: Path) -> None:
    question = chat("What is topic 4?")
    first = make_tiny("llama", default_model_dir, seed=0)
    other = make_tiny("llama", default_model_dir, seed=1)  # same shapes, other weights
    writer = Harness(first, cold=ColdTier(kvstore, "model-a"))
    writer.ask(question)
    assert writer.cache.cold.flush()
    writer.cache.cold.close()
    for namespace in ("model-b", "model-a"):  # another namespace, and even the same one
        reader = Harness(other, cold=ColdTier(kvstore, namespace))
        expected, _ = Harness(other).ask(question)
        got, finish = reader.ask(question)
        assert finish.usage.cold_tokens == 0 and finish.usage.cached_tokens == 0
        assert got == expected
        reader.cache.cold.close()


def test_blocks_read_ahead_restore_like_a_read_on_the_loop(kvstore: str, default_model_dir: Path) -> None:
    """The worker reads a prompt's SSD blocks on its tokenizer thread (`prepare`); the
    engine then decodes them and never touches the socket. Same hit, same tokens; a
    read-ahead whose hot prefix was evicted meanwhile is not used (it does not join up)."""
    tiny = make_tiny("llama", default_model_dir)
    question = chat("What is topic 4?")
    writer = Harness(tiny, cold=ColdTier(kvstore, "tiny-ahead"))
    expected, _ = writer.ask(question)
    assert writer.cache.cold.flush()
    writer.cache.cold.close()

    reader = Harness(tiny, cold=ColdTier(kvstore, "tiny-ahead"))
    request = AddRequest("ahead", messages=question, sampling=SamplingParams(max_tokens=12, temperature=0.0))
    prepared = reader.engine.questions.prepare(request)
    assert prepared.read_ahead is not None and prepared.read_ahead.start == 0
    fetches_before = reader.cache.cold.stats.fetch_s
    reader.engine.add(request, prepared)
    assert reader.cache.cold.stats.fetch_s == fetches_before, "the engine read from the socket itself"
    reader.run()
    got, finish = reader.result("ahead")
    assert got == expected
    assert finish.usage.cold_tokens == len(prepared.read_ahead.blocks) * BLOCK >= 4 * BLOCK

    # a fresh engine: the read-ahead claims to start at block 2, but blocks 0-1 are not hot
    gap = Harness(tiny, cold=ColdTier(kvstore, "tiny-ahead"))
    ids = gap.engine.questions.prompt_ids(request)
    ahead = gap.cache.read_ahead(ids, None)
    assert ahead is not None
    ahead.start = 2
    plan = gap.cache.plan(ids, None, ahead, fetch=False)
    assert plan.cold_blocks == 0 and plan.cached_tokens == 0
    # and without a read-ahead, fetch=False reads nothing at all
    assert gap.cache.plan(ids, None, None, fetch=False).cold_blocks == 0
    for h in (reader, gap):
        h.cache.cold.close()
