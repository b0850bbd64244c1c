"""`mlxd cache stats|clear` against one real service with two models (the default one and a
tiny random llama) and the cold tier on: a clear drops exactly the blocks asked for, in
the workers and in the kvstore, the next answer is computed again and equals the first,
and a stream running through a clear finishes with the same text."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.integration.service import REPO, Service, free_port, running_service
from tests.integration.test_pool import make_tiny_dir

pytestmark = pytest.mark.timeout(600)

DEFAULT = "SmolLM2-135M-Instruct"
TINY = "tiny-llama"
BLOCK = 64  # small blocks: a short prompt fills several
SYSTEM = ("You are a build assistant. " +
          " ".join(f"Step {i}: compile module {i}, then run its tests." for i in range(24)))


def convo(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


@pytest.fixture(scope="module")
def service(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    models = tmp_path_factory.mktemp("models")
    os.symlink(default_model_dir, models / DEFAULT)
    make_tiny_dir(models / TINY, default_model_dir)
    with running_service(["--model-dir", str(models), "--model", DEFAULT, "--block-tokens", str(BLOCK)],
                         tmp_path_factory.mktemp("home")) as svc:
        yield svc


@pytest.fixture(scope="module")
def client(service: Service) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{service.base_url}/v1", api_key="x", max_retries=0, timeout=300)


def ask(client: openai.OpenAI, model: str, question: str) -> tuple[str, int]:
    """(the greedy answer, its cached prompt tokens)."""
    reply = client.chat.completions.create(model=model, messages=convo(question), temperature=0, max_tokens=12)
    return reply.choices[0].message.content or "", reply.usage.prompt_tokens_details.cached_tokens


def mlxd_cache(svc: Service, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "router", "cache", *args, "--home", str(svc.home),
                           "--port", str(svc.port)], cwd=REPO, capture_output=True, text=True, timeout=120, check=False)


def cache_stats(svc: Service) -> dict[str, Any]:
    done = mlxd_cache(svc, "stats", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def of(stats: dict[str, Any], model: str) -> dict[str, Any]:
    (found,) = [m for m in stats["models"] if m["id"] == model]
    return found


def blocks(stats: dict[str, Any], model: str, tier: str) -> int:
    return (of(stats, model)[tier] or {}).get("blocks", 0)


def wait_for_stats(svc: Service, what: str, ok: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The stats once `ok` holds: hot figures come with the workers' pongs (every 2 s) and
    cold ones once the writes behind have reached the kvstore."""
    deadline = time.monotonic() + 30
    while not ok(stats := cache_stats(svc)):
        assert time.monotonic() < deadline, f"{what}: {json.dumps(stats, indent=1)}"
        time.sleep(0.5)
    return stats


def test_clear_of_one_model_drops_its_blocks_and_leaves_the_other(service: Service, client: openai.OpenAI) -> None:
    first, cached = ask(client, DEFAULT, "Which step compiles module 5?")
    assert cached == 0
    answer, cached = ask(client, DEFAULT, "Which step compiles module 5?")
    assert answer == first and cached > 0
    tiny_first, _ = ask(client, TINY, "Which step compiles module 5?")
    assert ask(client, TINY, "Which step compiles module 5?")[1] > 0

    before = wait_for_stats(service, "both models' blocks in both tiers", lambda s: all(
        blocks(s, m, tier) > 0 for m in (DEFAULT, TINY) for tier in ("hot_tier", "cold_tier")))
    assert of(before, DEFAULT)["hot_tier"]["hits"] > 0 and before["cold_tier"]["blocks"] > 0

    done = mlxd_cache(service, "clear", "--model", DEFAULT)
    assert done.returncode == 0, done.stderr
    hot = re.search(rf"^{DEFAULT}: removed (\d+) hot blocks", done.stdout, re.MULTILINE)
    cold = re.search(rf"^cold tier: removed (\d+) blocks \(model {DEFAULT}\)", done.stdout, re.MULTILINE)
    assert hot and int(hot.group(1)) > 0, done.stdout
    assert cold and int(cold.group(1)) >= blocks(before, DEFAULT, "cold_tier"), done.stdout
    assert TINY not in done.stdout  # nothing of the other model was touched

    after = wait_for_stats(service, "the cleared model's blocks gone", lambda s: blocks(s, DEFAULT, "hot_tier") == 0)
    assert blocks(after, DEFAULT, "cold_tier") == 0
    assert blocks(after, TINY, "hot_tier") >= blocks(before, TINY, "hot_tier")  # untouched (later writes may add)
    assert blocks(after, TINY, "cold_tier") >= blocks(before, TINY, "cold_tier")

    assert ask(client, DEFAULT, "Which step compiles module 5?") == (first, 0)  # computed again, the same
    answer, cached = ask(client, TINY, "Which step compiles module 5?")
    assert answer == tiny_first and cached > 0
    wait_for_stats(service, "the cleared model's blocks back", lambda s: blocks(s, DEFAULT, "hot_tier") > 0)


def test_a_stream_runs_on_through_a_clear_of_everything(service: Service, client: openai.OpenAI) -> None:
    question = "Count from 1 to 80, separated by commas."

    def stream(on_first_text: Callable[[], None] = lambda: None) -> tuple[str, float]:
        """The streamed answer, and when its last chunk came."""
        parts = []
        for chunk in client.chat.completions.create(model=DEFAULT, messages=convo(question), temperature=0,
                                                    max_tokens=96, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
                if len(parts) == 1:
                    on_first_text()
        return "".join(parts), time.monotonic()

    reference, _ = stream()
    started = threading.Event()
    result: list[tuple[str, float]] = []
    runner = threading.Thread(target=lambda: result.append(stream(started.set)))
    runner.start()
    assert started.wait(300)
    cleared = httpx.post(f"{service.base_url}/admin/cache/clear", timeout=120)
    cleared_at = time.monotonic()
    runner.join(300)
    assert cleared.status_code == 200, cleared.text
    (text, finished_at), = result
    assert finished_at > cleared_at, "the stream ended before the clear: make it longer"
    assert text == reference
    body = cleared.json()
    assert body["model"] is None and body["cold_tier"]["namespace"] is None and body["cold_tier"]["blocks"] > 0
    default = next(m for m in body["models"] if m["id"] == DEFAULT)
    assert default["loaded"] and default["hot_tier"]["blocks"] > 0
    assert ask(client, TINY, "Which step compiles module 5?")[1] == 0  # every model was cleared


def test_unknown_and_unloaded_models(service: Service, client: openai.OpenAI) -> None:
    r = httpx.post(f"{service.base_url}/admin/cache/clear", json={"model": "no-such-model"}, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert httpx.get(f"{service.base_url}/admin/cache", params={"model": "no-such-model"}).status_code == 404
    done = mlxd_cache(service, "clear", "--model", "no-such-model")
    assert done.returncode == 1 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "404" in done.stderr and "no-such-model" in done.stderr

    ask(client, TINY, "Which step runs the tests of module 9?")
    wait_for_stats(service, "the tiny model's cold blocks", lambda s: blocks(s, TINY, "cold_tier") > 0)
    assert httpx.post(f"{service.base_url}/admin/models/{TINY}/unload", timeout=120).status_code == 200
    done = mlxd_cache(service, "clear", "--model", TINY, "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["models"] == [{"id": TINY, "loaded": False, "hot_tier": None}]
    assert answer["cold_tier"]["blocks"] > 0 and "not loaded" in answer["notes"][0]
    stats = cache_stats(service)
    assert of(stats, TINY)["hot_tier"] is None and blocks(stats, TINY, "cold_tier") == 0


def test_no_service_is_one_line_and_exit_1(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "router", "cache", "stats", "--home", str(tmp_path),
                           "--port", str(free_port())], cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "no mlxd answering" in done.stderr
