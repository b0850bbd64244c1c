"""The cold tier on the real default model: prefixes survive a worker restart and a full
service restart, and answers restored from disk equal answers computed from scratch."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.integration.service import Service

pytestmark = pytest.mark.timeout(600)

SYSTEM = ("You are a release assistant. " +
          " ".join(f"Step {i}: check that package {i} builds, then tag it as v{i}.0." for i in range(40)))
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is step 12?"}]


def ask(svc: Service, model: str, salt: str) -> dict:
    body = {"model": model, "messages": MESSAGES, "max_tokens": 20, "temperature": 0, "cache_salt": salt}
    r = httpx.post(f"{svc.base_url}/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("home")


def start(default_model_dir: Path, home: Path) -> Service:
    svc = Service(["--model", str(default_model_dir)], home=home)
    svc.wait_ready()
    return svc


def test_worker_restart_restores_the_prefix_from_ssd(default_model_dir: Path, home: Path) -> None:
    svc = start(default_model_dir, home)
    try:
        model = httpx.get(f"{svc.base_url}/v1/models").json()["data"][0]["id"]
        scratch = ask(svc, model, "ssd-1")
        assert scratch["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        pid = svc.health()["workers"][model]["pid"]
        r = httpx.post(f"{svc.base_url}/admin/workers/{model}/restart", timeout=300)
        assert r.status_code == 200, r.text
        assert r.json()["pid"] != pid and r.json()["state"] == "ready"
        restored = ask(svc, model, "ssd-1")
        cache = restored["mlxd"]["cache"]
        assert cache["cold_tokens"] >= 512
        assert restored["usage"]["prompt_tokens_details"]["cached_tokens"] >= cache["cold_tokens"]
        assert restored["choices"][0]["message"]["content"] == scratch["choices"][0]["message"]["content"]
        assert "cold blocks" in svc.log_text()
    finally:
        svc.stop()


def test_full_service_restart_keeps_the_cache(default_model_dir: Path, home: Path) -> None:
    svc = start(default_model_dir, home)
    try:
        model = httpx.get(f"{svc.base_url}/v1/models").json()["data"][0]["id"]
        scratch = ask(svc, model, "ssd-2")
    finally:
        svc.stop()  # graceful: pending SSD writes are flushed
    svc = start(default_model_dir, home)
    try:
        restored = ask(svc, model, "ssd-2")
        assert restored["mlxd"]["cache"]["cold_tokens"] >= 512
        assert restored["choices"][0]["message"]["content"] == scratch["choices"][0]["message"]["content"]
        # and the first module's prefix (another salt) is still on disk too
        assert ask(svc, model, "ssd-1")["mlxd"]["cache"]["cold_tokens"] >= 512
    finally:
        svc.stop()


def test_a_killed_kvstore_is_restarted_and_answers_stay_those_computed_from_scratch(default_model_dir: Path,
                                                                                    tmp_path: Path) -> None:
    """Killing the kvstore changes no answer: every one equals the answer computed from
    scratch before the kill (greedy, its own salt), while it is down (a hot hit, and a new
    prefix), once it is back, and from the restarted kvstore's own blocks after a worker
    restart."""
    import os
    import signal
    import time

    svc = start(default_model_dir, tmp_path / "home")
    try:
        model = httpx.get(f"{svc.base_url}/v1/models").json()["data"][0]["id"]
        scratch = ask(svc, model, "kv-scratch")
        assert scratch["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        expected = scratch["choices"][0]["message"]["content"]
        assert expected

        def answer(salt: str) -> dict:
            got = ask(svc, model, salt)
            assert got["choices"][0]["message"]["content"] == expected, salt
            return got

        pid = svc.health()["kvstore"]["pid"]
        os.kill(pid, signal.SIGKILL)
        # requests do not depend on the cold tier being up: a miss, not an error, nor another answer
        assert answer("kv-scratch")["usage"]["prompt_tokens_details"]["cached_tokens"] >= 512  # hot
        assert answer("kv-down")["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        deadline = time.monotonic() + 30
        while True:
            kv = svc.health()["kvstore"]
            if kv["state"] == "ready" and kv["pid"] not in (None, pid):
                break
            assert time.monotonic() < deadline, f"kvstore not restarted: {kv}"
            time.sleep(0.2)
        assert kv["restarts"] == 1
        assert answer("kv-up")["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        # the restarted kvstore took kv-up's blocks: a new worker answers from them the same
        r = httpx.post(f"{svc.base_url}/admin/workers/{model}/restart", timeout=300)
        assert r.status_code == 200, r.text
        assert answer("kv-up")["mlxd"]["cache"]["cold_tokens"] >= 512
    finally:
        svc.stop()
