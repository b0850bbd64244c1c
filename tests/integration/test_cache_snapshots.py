"""Named snapshots on the real service and the real default model, with cache budgets small
enough that a few prompts evict everything: a pinned prefix stays in both tiers through
that pressure, through a worker restart and a service restart (then it is an SSD hit for
any request that starts with it), and DELETE makes it evictable again. Errors come in
OpenAI's shape."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.service import Service, kv_block_bytes

pytestmark = pytest.mark.timeout(900)

MODEL = "SmolLM2-135M-Instruct"
BLOCK = 64
SYSTEM = ("You are the release bot of a large monorepo. " +
          " ".join(f"Rule {i}: package {i} ships only after its tests pass." for i in range(14)))
SNAPSHOT_MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Which rule covers package 3?"}]
# a later turn of the same conversation: its prompt starts with the snapshot's
FOLLOW_UP = [*SNAPSHOT_MESSAGES, {"role": "assistant", "content": "Rule 3."},
             {"role": "user", "content": "And package 9?"}]


def start(model_dir: Path, home: Path) -> Service:
    size = kv_block_bytes(model_dir, BLOCK)
    svc = Service(["--model", str(model_dir), "--block-tokens", str(BLOCK),
                   "--hot-tier-bytes", str(9 * size),  # 9 blocks of RAM per worker
                   "--segment-bytes", str(4 << 20),  # one block per segment: an evicted block frees its file
                   "--max-disk-bytes", str(8 * size)], home=home)  # about 7 blocks on disk
    svc.wait_ready()
    return svc


def post(svc: Service, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{svc.base_url}{path}", json=body, timeout=300)


def probe(svc: Service, body: dict[str, Any]) -> dict[str, Any]:
    r = post(svc, "/admin/cache/probe", {"model": MODEL, **body})
    assert r.status_code == 200, r.text
    return r.json()


def chat(svc: Service, messages: list[dict[str, str]]) -> dict[str, Any]:
    r = post(svc, "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def cached(reply: dict[str, Any]) -> tuple[int, int]:
    """(cached_tokens, the part of them restored from SSD)."""
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"], reply["mlxd"]["cache"]["cold_tokens"]


def pressure(svc: Service, round_: int) -> list[list[int]]:
    """Eight prompts of three blocks each, 24 blocks through a hot tier of 9 and a disk of
    about 7: whatever is not pinned goes. Returns them; waits until the first one's blocks
    are gone from SSD too (its writes and evictions happen behind the answers)."""
    prompts = [list(range(1000 + 500 * i + 4000 * round_, 1000 + 500 * i + 4000 * round_ + 3 * BLOCK + 2))
               for i in range(8)]
    for prompt in prompts:
        r = post(svc, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0})
        assert r.status_code == 200, r.text
    deadline = time.monotonic() + 30
    while any(b["in_cold_tier"] or b["tier"] != "missing" for b in probe(svc, {"prompt": prompts[0]})["blocks"]):
        assert time.monotonic() < deadline, "the first prompt's blocks were not evicted"
        time.sleep(0.5)
    return prompts


def snapshot_state(svc: Service) -> dict[str, Any]:
    """The snapshot's own prompt, probed: its blocks and where they are."""
    return probe(svc, {"messages": SNAPSHOT_MESSAGES})


def assert_pinned_in_both_tiers(svc: Service, num_blocks: int) -> None:
    found = snapshot_state(svc)
    blocks = found["blocks"][:num_blocks]
    assert [(b["tier"], b["in_cold_tier"], b["pinned"]) for b in blocks] == [("hot", True, True)] * num_blocks, found


def test_a_snapshot_outlives_eviction_and_restarts_until_deleted(default_model_dir: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    svc = start(default_model_dir, home)
    try:
        r = post(svc, "/admin/cache/snapshots", {"name": "release-bot", "model": MODEL, "messages": SNAPSHOT_MESSAGES})
        assert r.status_code == 201, r.text
        created = r.json()
        num_blocks = created["blocks"]
        assert num_blocks >= 3 and created["tokens"] == num_blocks * BLOCK
        assert created["computed_tokens"] == created["prompt_tokens"]  # nothing was cached: prefill ran
        assert created["cold"] == {"blocks": num_blocks, "bytes": created["bytes"]} and created["bytes"] > 0
        assert created["ssd"] == created["cold"]  # its old name, until 0.2
        assert created["hot"]["blocks"] == num_blocks and created["hot"]["bytes"] >= num_blocks * BLOCK
        assert created["keys"] == [b["key"] for b in snapshot_state(svc)["blocks"]][:num_blocks]

        others = pressure(svc, 0)
        assert_pinned_in_both_tiers(svc, num_blocks)
        assert all(b["tier"] == "missing" and not b["in_cold_tier"] for b in probe(svc, {"prompt": others[0]})["blocks"])
        stats = httpx.get(f"{svc.base_url}/admin/cache?model={MODEL}", timeout=30).json()
        assert stats["cold_tier"]["pinned_blocks"] == num_blocks and stats["cold_tier"]["snapshots"] == 1
        assert stats["cold_tier"]["bytes"] <= stats["cold_tier"]["max_bytes"]  # pinned bytes count against it
        follow = probe(svc, {"messages": FOLLOW_UP})
        reply = chat(svc, FOLLOW_UP)
        assert cached(reply)[0] == follow["cached_tokens"] >= num_blocks * BLOCK

        r = httpx.post(f"{svc.base_url}/admin/workers/{MODEL}/restart", timeout=300)
        assert r.status_code == 200, r.text
        found = snapshot_state(svc)  # the new worker pinned the keys when it started; they are on SSD
        assert [(b["tier"], b["pinned"]) for b in found["blocks"][:num_blocks]] == [("cold", True)] * num_blocks
        assert cached(chat(svc, FOLLOW_UP))[1] >= num_blocks * BLOCK  # an SSD hit, and hot again...
        pressure(svc, 1)
        assert_pinned_in_both_tiers(svc, num_blocks)  # ...and pinned there
    finally:
        svc.stop()

    svc = start(default_model_dir, home)
    try:
        (listed,) = httpx.get(f"{svc.base_url}/admin/cache/snapshots", timeout=30).json()["data"]
        assert listed["name"] == "release-bot" and listed["model"] == MODEL
        assert (listed["tokens"], listed["blocks"], listed["cold"]["blocks"]) == (num_blocks * BLOCK, num_blocks,
                                                                                 num_blocks)
        assert listed["bytes"] == created["bytes"]
        follow = probe(svc, {"messages": FOLLOW_UP})
        assert follow["hot_tokens"] == 0 and follow["cold_tokens"] >= num_blocks * BLOCK
        assert cached(chat(svc, FOLLOW_UP)) == (follow["cached_tokens"], follow["cold_tokens"])

        r = httpx.delete(f"{svc.base_url}/admin/cache/snapshots/release-bot", timeout=60)
        assert r.status_code == 200 and r.json()["deleted"] is True, r.text
        assert httpx.get(f"{svc.base_url}/admin/cache/snapshots", timeout=30).json()["data"] == []
        pressure(svc, 2)
        first = snapshot_state(svc)["blocks"][0]
        assert (first["tier"], first["in_cold_tier"], first["pinned"]) == ("missing", False, False)
        assert cached(chat(svc, FOLLOW_UP)) == (0, 0)
    finally:
        svc.stop()


def test_snapshot_errors_are_openai_shaped(default_model_dir: Path, tmp_path: Path) -> None:
    svc = start(default_model_dir, tmp_path / "home")
    try:
        body = {"name": "dup", "model": MODEL, "prompt": list(range(300, 300 + 2 * BLOCK + 5))}
        assert post(svc, "/admin/cache/snapshots", body).status_code == 201
        cases = [
            (post(svc, "/admin/cache/snapshots", body), 409, "name", "snapshot_exists"),
            (httpx.delete(f"{svc.base_url}/admin/cache/snapshots/no-such-snapshot", timeout=30), 404, "name",
             "snapshot_not_found"),
            (post(svc, "/admin/cache/snapshots", {**body, "name": None}), 400, "name", None),
            (post(svc, "/admin/cache/snapshots", {**body, "name": "has space"}), 400, "name", None),
            (post(svc, "/admin/cache/snapshots", {"name": "x", "model": MODEL}), 400, "messages", None),
            (post(svc, "/admin/cache/snapshots", {"name": "x", "model": MODEL, "prompt": [1, 2, 3]}), 400, "prompt",
             None),
            (post(svc, "/admin/cache/snapshots", {"name": "x", "model": MODEL, "messages": [{"role": "nobody"}]}),
             400, "messages", None),
            (post(svc, "/admin/cache/snapshots", {"name": "x", "model": "no-such-model", "prompt": "hi"}), 404,
             "model", "model_not_found"),
        ]
        for r, status, param, code in cases:
            assert r.status_code == status, r.text
            error = r.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}, r.text
            assert (error["param"], error["code"]) == (param, code), r.text
            assert isinstance(error["message"], str) and error["message"]
        r = httpx.post(f"{svc.base_url}/admin/cache/snapshots", content=b"[1, 2]",
                       headers={"content-type": "application/json"}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        assert [s["name"] for s in httpx.get(f"{svc.base_url}/admin/cache/snapshots").json()["data"]] == ["dup"]
        assert httpx.delete(f"{svc.base_url}/admin/cache/snapshots/dup", timeout=30).status_code == 200
    finally:
        svc.stop()
