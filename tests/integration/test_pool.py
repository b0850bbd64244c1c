"""Several models under one memory budget: lazy loading, LRU eviction, pins, TTLs,
profiles and the /admin routes, on the real default model plus a tiny random-weight one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.service import REPO, Service, free_port

pytestmark = pytest.mark.timeout(600)

DEFAULT = "SmolLM2-135M-Instruct"
TINY = "tiny-llama"
HOT = 64 << 20
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def make_tiny_dir(target: Path, default_model_dir: Path, vocab_size: int | None = None) -> Path:
    """A 2-layer random llama with the real tokenizer, saved as an MLX model directory
    (`vocab_size`: wider than the tokenizer's, for tokens a test adds to it)."""
    target.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        if (default_model_dir / name).exists():
            shutil.copy(default_model_dir / name, target / name)
    code = f"""
import json, mlx.core as mx
from mlx.utils import tree_flatten
from tests.worker.tiny_models import ARCHS
from mlx_lm.models import llama
config = dict(ARCHS["llama"], **({{"vocab_size": {vocab_size}}} if {vocab_size!r} else {{}}))
mx.random.seed(0)
model = llama.Model(llama.ModelArgs.from_dict(config))
mx.save_safetensors({str(target / "model.safetensors")!r}, dict(tree_flatten(model.parameters())))
json.dump(config, open({str(target / "config.json")!r}, "w"))
"""
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
    return target


@pytest.fixture(scope="module")
def model_dir(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    models = tmp_path_factory.mktemp("models")
    os.symlink(default_model_dir, models / DEFAULT)
    make_tiny_dir(models / TINY, default_model_dir)
    return models


def budget_for_one(model_dir: Path) -> int:
    """A budget that holds either model alone but not both (estimates as the pool makes them)."""
    from router.model_registry import RUNTIME_OVERHEAD_BYTES, discover

    entries = discover(model_dir)
    big, small = (entries[m].weights_bytes + HOT + RUNTIME_OVERHEAD_BYTES for m in (DEFAULT, TINY))
    return big + small // 2


def start(model_dir: Path, home: Path, *, config: str = "", extra: list[str] | None = None) -> Service:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(config)
    svc = Service(["--model-dir", str(model_dir), "--model", DEFAULT, "--hot-tier-bytes", str(HOT),
                   "--memory-budget-bytes", str(budget_for_one(model_dir)), "--no-cold-tier", *(extra or [])],
                  home=home)
    svc.wait_ready()
    return svc


def chat(svc: Service, model: str, **extra) -> httpx.Response:
    body = {"model": model, "messages": QUESTION, "max_tokens": 8, "temperature": 0, **extra}
    body = {k: v for k, v in body.items() if v is not None}  # None: not sent at all
    return httpx.post(f"{svc.base_url}/v1/chat/completions", json=body, timeout=300)


def status(svc: Service) -> dict:
    return httpx.get(f"{svc.base_url}/admin/status", timeout=10).json()


def model_state(svc: Service, model: str) -> dict:
    return next(m for m in status(svc)["models"] if m["id"] == model)


def test_lazy_load_evicts_the_least_recently_used(model_dir: Path, tmp_path: Path) -> None:
    svc = start(model_dir, tmp_path / "home")
    try:
        listed = {m["id"]: m for m in httpx.get(f"{svc.base_url}/v1/models").json()["data"]}
        assert listed[DEFAULT]["state"] in ("idle", "ready") and listed[TINY]["state"] == "unloaded"
        assert listed[TINY]["kind"] == "chat"
        assert chat(svc, TINY).status_code == 200
        assert model_state(svc, TINY)["state"] in ("idle", "ready")
        assert model_state(svc, DEFAULT)["state"] == "unloaded"  # evicted to make room
        answer = chat(svc, DEFAULT)  # and back
        assert "Paris" in answer.json()["choices"][0]["message"]["content"]
        assert model_state(svc, TINY)["state"] == "unloaded"
    finally:
        svc.stop()


def test_a_stream_in_flight_is_never_evicted(model_dir: Path, tmp_path: Path) -> None:
    svc = start(model_dir, tmp_path / "home")
    try:
        events: list[dict] = []

        def stream() -> None:
            body = {"model": DEFAULT, "messages": [{"role": "user", "content": "Write a long story."}],
                    "max_tokens": 120, "temperature": 0, "stream": True}
            with httpx.stream("POST", f"{svc.base_url}/v1/chat/completions", json=body, timeout=300) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        events.append(json.loads(line[6:]))

        reader = threading.Thread(target=stream)
        reader.start()
        while len(events) < 3:
            time.sleep(0.05)
        assert chat(svc, TINY).status_code == 200  # waits for the stream, then evicts
        reader.join()
        finishes = [c["choices"][0]["finish_reason"] for c in events if c.get("choices")]
        assert "length" in finishes and not any("error" in c for c in events)
    finally:
        svc.stop()


def test_pins_ttls_profiles_and_status(model_dir: Path, tmp_path: Path) -> None:
    config = f"""
[models."{TINY}"]
ttl_s = 2

[profiles."{DEFAULT}:brief"]
max_tokens = 3
temperature = 0
system_prompt = "You answer in one word."
"""
    svc = start(model_dir, tmp_path / "home", config=config, extra=["--pin", DEFAULT])
    try:
        # pinned: never evicted, so the other model cannot fit next to it
        refused = chat(svc, TINY)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "insufficient_memory"
        assert model_state(svc, DEFAULT)["pinned"] is True
        # unpin: now the tiny model loads (evicting the default), and its TTL unloads it
        assert httpx.post(f"{svc.base_url}/admin/models/{DEFAULT}/unpin").json()["pinned"] is False
        assert chat(svc, TINY).status_code == 200
        assert model_state(svc, DEFAULT)["state"] == "unloaded"
        deadline = time.monotonic() + 20
        while model_state(svc, TINY)["state"] != "unloaded":
            assert time.monotonic() < deadline, "the TTL did not unload the idle model"
            time.sleep(0.5)
        # profile defaults apply, and request parameters override them
        brief = chat(svc, f"{DEFAULT}:brief", max_tokens=None)
        assert brief.status_code == 200 and brief.json()["usage"]["completion_tokens"] <= 3
        # the profile's system prompt is the one the model saw
        explicit = chat(svc, DEFAULT, messages=[{"role": "system", "content": "You answer in one word."}, *QUESTION])
        assert brief.json()["usage"]["prompt_tokens"] == explicit.json()["usage"]["prompt_tokens"]
        assert chat(svc, f"{DEFAULT}:brief", max_tokens=6).json()["usage"]["completion_tokens"] > 3
        ids = [m["id"] for m in httpx.get(f"{svc.base_url}/v1/models").json()["data"]]
        assert f"{DEFAULT}:brief" in ids
        # admin load / unload
        assert httpx.post(f"{svc.base_url}/admin/models/{DEFAULT}/unload", timeout=60).status_code == 200
        assert model_state(svc, DEFAULT)["state"] == "unloaded"
        assert httpx.post(f"{svc.base_url}/admin/models/{DEFAULT}/load", timeout=300).status_code == 200
        check_status_schema(status(svc))
    finally:
        svc.stop()


def check_status_schema(body: dict) -> None:
    """The documented schema (README "Admin status"), with plausible numbers."""
    import psutil

    assert set(body) == {"version", "uptime_s", "starting", "config_file", "keys", "memory", "models", "kvstore",
                         "requests", "totals", "history"}
    assert body["uptime_s"] > 0 and body["starting"] is False and body["keys"] == []
    memory = body["memory"]
    assert set(memory) >= {"total_bytes", "available_bytes", "budget_bytes", "used_bytes", "workers"}
    assert memory["total_bytes"] == psutil.virtual_memory().total
    model_keys = {"id", "kind", "state", "pinned", "ttl_s", "ttl_left_s", "last_used", "pid", "rss_bytes",
                  "requests_in_flight", "recent_prompt_tok_s", "recent_decode_tok_s", "mlx_memory", "hot_tier",
                  "hot_cache"}
    for model in body["models"]:
        assert set(model) >= model_keys
        if model["state"] in ("ready", "idle"):
            assert psutil.pid_exists(model["pid"])
            assert 100 << 20 < model["rss_bytes"] < memory["total_bytes"]
            assert memory["workers"][model["id"]] > 0
            assert model["hot_tier"]["budget_bytes"] == HOT
            assert model["hot_cache"] == model["hot_tier"]  # the old name, until 0.2
            assert set(model["mlx_memory"]) == {"active", "cache", "peak"}
            assert 0 <= model["mlx_memory"]["cache"] <= 256 << 20  # mlx_cache_mb's default
    assert isinstance(body["requests"], list)
    for request in body["requests"]:
        assert set(request) == {"id", "model", "route", "user_agent", "state", "tokens", "prompt_tokens",
                                "cached_tokens", "generated_tokens", "tok_s", "age_s"}
    assert set(body["totals"]) == {"requests", "generated_tokens", "prompt_tokens"}
    assert set(body["totals"]["prompt_tokens"]) == {"hot", "cold", "computed", "ssd"}  # ssd: cold's old name
    assert body["totals"]["prompt_tokens"]["ssd"] == body["totals"]["prompt_tokens"]["cold"]
    assert set(body["history"]) == {"interval_s", "hit_rate_window_s", "points"}
    for point in body["history"]["points"]:
        assert set(point) == {"t", "generated_tok_s", "prompt_tok_s", "requests_per_s", "hot_hit_rate",
                              "cold_hit_rate", "ssd_hit_rate", "running", "queued"}
        assert point["ssd_hit_rate"] == point["cold_hit_rate"]  # the old name, until 0.2


@pytest.fixture(scope="module")
def shared(model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    svc = start(model_dir, tmp_path_factory.mktemp("home"))
    yield svc
    svc.stop()


def test_an_idle_worker_gives_its_freed_buffers_back(shared: Service) -> None:
    """MLX's buffer cache is emptied when the last request of a batch finishes (the soak
    saw worker RSS grow 38% under steady load with an uncapped cache)."""
    assert chat(shared, DEFAULT).status_code == 200
    deadline = time.monotonic() + 30
    while True:  # the figures come with the worker's next pong
        status = httpx.get(f"{shared.base_url}/admin/status", timeout=10).json()
        model = next(m for m in status["models"] if m["id"] == DEFAULT)
        if model["mlx_memory"]["peak"] > 0 and model["mlx_memory"]["cache"] == 0:
            break
        assert time.monotonic() < deadline, model["mlx_memory"]
        time.sleep(0.5)
    assert model["mlx_memory"]["active"] > 50 << 20  # the weights stay


def test_mlxd_status_prints_the_running_services_table(shared: Service) -> None:
    """`mlxd status` finds the service by the same --home/--port, and --json is the admin status."""
    assert chat(shared, DEFAULT).status_code == 200
    where = ["--home", str(shared.home), "--port", str(shared.port)]
    done = subprocess.run([sys.executable, "-m", "router", "status", *where], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"mlxd 0.1.0 at {shared.base_url}, up ")
    rows = {line.split()[0]: line.split() for line in lines if line.split() and line.split()[0] in (DEFAULT, TINY)}
    assert rows[DEFAULT][1] in ("ready", "idle") and rows[TINY][1] == "unloaded", done.stdout
    assert "cold tier: off" in done.stdout  # the shared service runs --no-cold-tier
    as_json = subprocess.run([sys.executable, "-m", "router", "status", "--json", *where], cwd=REPO,
                             capture_output=True, text=True, timeout=60, check=False)
    check_status_schema(json.loads(as_json.stdout))


@pytest.mark.parametrize("name", ["../SmolLM2-135M-Instruct", "/etc/passwd", "SmolLM2-135M-Instruct:nope"])
def test_names_are_looked_up_never_paths(shared: Service, name: str) -> None:
    r = chat(shared, name)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("config, key", [
    ("max_num_seqz = 3\n", "max_num_seqz"),
    ("max_num_seqs = 0\n", "max_num_seqs"),
    ('[profiles."x:y"]\ntemprature = 1\n', "temprature"),
])
def test_bad_config_fails_startup_naming_the_key(tmp_path: Path, default_model_dir: Path, config: str, key: str) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text(config)
    proc = subprocess.run([sys.executable, "-m", "router", "serve", "--port", str(free_port()), "--home", str(home),
                           "--model", str(default_model_dir)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert key in proc.stdout + proc.stderr


@pytest.mark.parametrize("fields, param", [
    ({"temperature": "hot"}, "temperature"),
    ({"messages": []}, "messages"),
    ({"max_tokens": 2**70}, "max_tokens"),
])
def test_a_malformed_body_for_an_unloaded_model_never_loads_it(shared: Service, fields: dict, param: str) -> None:
    """Parse and validate come before acquire: a bad body costs no load (or eviction)."""
    assert model_state(shared, TINY)["state"] == "unloaded"
    before = model_state(shared, DEFAULT)
    r = chat(shared, TINY, **fields)
    assert r.status_code == 400 and r.json()["error"]["param"] == param
    assert model_state(shared, TINY)["state"] == "unloaded"
    after = model_state(shared, DEFAULT)
    assert after["pid"] == before["pid"] and after["state"] in ("idle", "ready")
