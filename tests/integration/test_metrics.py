"""GET /metrics and `mlxd status --watch` on the real default model: the exposition parses
with Prometheus' own parser, and after real requests (the openai SDK, streamed and not, a
hot hit, an SSD hit after a worker restart) the counters and histograms moved by exactly
what the answers' `usage` says; the children's counters stay monotonic across the restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.service import REPO, Service, running_service
from tests.router.test_logs_cli import ctrl_c_as_a_terminal_sends_it

pytestmark = pytest.mark.timeout(600)

CHAT = "/v1/chat/completions"
# about 1000 tokens of system prompt: three whole 256-token blocks, so the prefix cache holds it
SYSTEM = ("You are a release assistant. " +
          " ".join(f"Step {i}: check that package {i} builds, then tag it as v{i}.0." for i in range(60)))

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(service: Service) -> Samples:
    response = httpx.get(f"{service.base_url}/metrics", timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    families = list(text_string_to_metric_families(response.text))
    assert {f.name for f in families} >= {"mlxd_requests", "mlxd_prompt_tokens", "mlxd_time_to_first_token_seconds",
                                          "mlxd_hot_tier_bytes", "mlxd_process_resident_memory_bytes"}
    return {(s.name, frozenset(s.labels.items())): s.value for f in families for s in f.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def wait_for(probe: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def usage_of(answer: Any) -> dict[str, int]:
    """prompt, cached, cold-tier and completion tokens of an SDK answer (or a final stream chunk)."""
    extension = (answer.model_extra or {}).get("mlxd") or {}
    return {"prompt": answer.usage.prompt_tokens, "cached": answer.usage.prompt_tokens_details.cached_tokens,
            "cold": (extension.get("cache") or {}).get("cold_tokens", 0), "completion": answer.usage.completion_tokens}


def ask(client: OpenAI, model: str, question: str, salt: str, *, stream: bool = False) -> dict[str, int]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    extra = {"cache_salt": salt}
    if not stream:
        return usage_of(client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0,
                                                       extra_body=extra))
    final = None
    for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0,
                                                stream=True, stream_options={"include_usage": True},
                                                extra_body=extra):
        if chunk.usage is not None:
            final = chunk
    assert final is not None, "no usage chunk"
    return usage_of(final)


def expected_deltas(usages: list[dict[str, int]]) -> dict[str, int]:
    return {"hot": sum(u["cached"] - u["cold"] for u in usages), "cold": sum(u["cold"] for u in usages),
            "computed": sum(u["prompt"] - u["cached"] for u in usages),
            "generated": sum(u["completion"] for u in usages)}


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


@pytest.fixture(scope="module")
def service(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """A service of its own, not the shared one: these tests count the model's loads from
    the first and restart its worker."""
    with running_service(["--model", str(default_model_dir)], tmp_path_factory.mktemp("home")) as svc:
        yield svc


def test_the_step_counters_split_the_steps_and_only_a_constrained_request_moves_the_grammar_s(
        service: Service, model_id: str) -> None:
    """The worker's step clock (worker/step_clock.py), as bench/structured.py reads it: a
    free answer moves the steps and their time but not the grammar's; a constrained one
    moves the grammar's too, and every part stays inside the whole it belongs to."""
    client = OpenAI(base_url=f"{service.base_url}/v1", api_key="unused", max_retries=0)
    steps = "mlxd_engine_steps_total"

    def settled(before: Samples, at_least: float) -> Samples:
        wait_for(lambda: moved(before, scrape(service), steps, model=model_id) >= at_least, "the steps in a pong")
        time.sleep(2.5)  # one more heartbeat: the pong after the last step
        return scrape(service)

    before = scrape(service)
    free = client.chat.completions.create(model=model_id, max_tokens=10, temperature=0, messages=[
        {"role": "user", "content": "Name three colours."}], extra_body={"cache_salt": "step-clock-free"})
    after_free = settled(before, free.usage.completion_tokens)
    assert moved(before, after_free, "mlxd_engine_step_rows_total", model=model_id) >= free.usage.completion_tokens - 1
    assert moved(before, after_free, "mlxd_grammar_mask_seconds_total", model=model_id) == 0
    assert moved(before, after_free, "mlxd_grammar_wait_seconds_total", model=model_id) == 0
    constrained = client.chat.completions.create(
        model=model_id, max_tokens=10, temperature=0, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "Three colours as JSON."}], extra_body={"cache_salt": "step-clock-json"})
    after = settled(after_free, constrained.usage.completion_tokens)
    mask = moved(after_free, after, "mlxd_grammar_mask_seconds_total", model=model_id)
    wait = moved(after_free, after, "mlxd_grammar_wait_seconds_total", model=model_id)
    generate = moved(after_free, after, "mlxd_engine_step_generate_seconds_total", model=model_id)
    whole = moved(after_free, after, "mlxd_engine_step_seconds_total", model=model_id)
    assert 0 < mask and 0 <= wait and mask + wait <= generate <= whole, (mask, wait, generate, whole)


def test_counters_and_histograms_move_by_what_the_answers_say(service: Service, model_id: str) -> None:
    client = OpenAI(base_url=f"{service.base_url}/v1", api_key="unused", max_retries=0)
    before = scrape(service)
    ok = {"route": CHAT, "model": model_id, "status": "200"}
    usages = [ask(client, model_id, "What is step 12?", "metrics-1"),  # computed
              ask(client, model_id, "What is step 30?", "metrics-1"),  # the system prompt from the hot tier
              ask(client, model_id, "What is step 7?", "metrics-1", stream=True)]  # hot again, streamed
    assert usages[0]["cached"] == 0 and usages[1]["cached"] >= 512 and usages[2]["cached"] >= 512
    assert all(u["cold"] == 0 for u in usages)
    # the request counter moves when the answer has been sent: an instant after the client has it
    wait_for(lambda: moved(before, scrape(service), "mlxd_requests_total", **ok) == 3, "3 counted requests")
    after = scrape(service)
    want = expected_deltas(usages)
    for source in ("hot", "cold", "computed"):
        assert moved(before, after, "mlxd_prompt_tokens_total", model=model_id, source=source) == want[source], source
    assert moved(before, after, "mlxd_generated_tokens_total", model=model_id) == want["generated"]
    for histogram in ("mlxd_time_to_first_token_seconds", "mlxd_queue_seconds", "mlxd_prefill_seconds",
                      "mlxd_request_duration_seconds"):
        assert moved(before, after, f"{histogram}_count", model=model_id) == 3, histogram
        assert moved(before, after, f"{histogram}_bucket", model=model_id, le="+Inf") == 3, histogram
    assert moved(before, after, "mlxd_request_duration_seconds_sum", model=model_id) > 0
    assert moved(before, after, "mlxd_cold_tier_restore_seconds_count", model=model_id) == 0
    # the hot tier's block counters come from the worker's pongs (every heartbeat_s)
    wait_for(lambda: value(scrape(service), "mlxd_hot_tier_hits_total", model=model_id)
             >= value(before, "mlxd_hot_tier_hits_total", model=model_id) + 4, "hot-tier hits from the pongs")
    assert value(after, "mlxd_hot_tier_blocks", model=model_id) >= 3
    assert value(after, "mlxd_model_state", model=model_id, state="idle") == 1
    assert value(after, "mlxd_model_loads_total", model=model_id) == 1
    assert value(after, "mlxd_process_resident_memory_bytes", role="worker", model=model_id) > 50e6
    assert value(after, "mlxd_process_resident_memory_bytes", role="router", model="") > 10e6
    assert value(after, "mlxd_process_resident_memory_bytes", role="kvstore", model="") > 0
    # refused and unknown requests count too, without a model (a client's name never becomes a label)
    assert httpx.post(f"{service.base_url}{CHAT}", json={"model": "no-such-model", "messages": []}).status_code == 404
    assert httpx.get(f"{service.base_url}/no/such/path").status_code == 404
    wait_for(lambda: value(scrape(service), "mlxd_requests_total", route="unmatched", model="", status="404") >= 1,
             "the unmatched 404")
    assert value(scrape(service), "mlxd_requests_total", route=CHAT, model="", status="404") >= 1


def test_a_cold_hit_after_a_worker_restart_and_counters_that_stay_monotonic(service: Service, model_id: str) -> None:
    client = OpenAI(base_url=f"{service.base_url}/v1", api_key="unused", max_retries=0)
    assert ask(client, model_id, "What is step 3?", "metrics-2")["cached"] == 0
    wait_for(lambda: value(scrape(service), "mlxd_cold_tier_writes_total") > 0
             and value(scrape(service), "mlxd_write_behind_queue_blocks", model=model_id) == 0,
             "the prefix written to the SSD")
    before = scrape(service)
    restart = httpx.post(f"{service.base_url}/admin/workers/{model_id}/restart", timeout=300)
    assert restart.status_code == 200, restart.text
    usage = ask(client, model_id, "What is step 4?", "metrics-2")
    assert usage["cold"] >= 512 and usage["cached"] >= usage["cold"]
    wait_for(lambda: moved(before, scrape(service), "mlxd_cold_tier_restore_seconds_count", model=model_id) == 1,
             "the cold-tier restore observed")
    after = scrape(service)
    want = expected_deltas([usage])
    for source in ("hot", "cold", "computed"):
        assert moved(before, after, "mlxd_prompt_tokens_total", model=model_id, source=source) == want[source], source
    assert moved(before, after, "mlxd_worker_restarts_total", model=model_id) == 1
    assert moved(before, after, "mlxd_cold_tier_restored_bytes_total", model=model_id) > 0
    # the new worker counts from zero; the router's totals never go down
    for counter in ("mlxd_hot_tier_hits_total", "mlxd_hot_tier_misses_total", "mlxd_hot_tier_inserts_total"):
        assert value(after, counter, model=model_id) >= value(before, counter, model=model_id), counter
    wait_for(lambda: moved(before, scrape(service), "mlxd_cold_tier_restored_blocks_total", model=model_id) >= 2,
             "restored blocks from the new worker's pongs")
    last = scrape(service)
    assert value(last, "mlxd_cold_tier_hits_total", model=model_id) >= 2
    # the old names, until 0.2 (router/old_names.py): the same samples
    for new, old in (("mlxd_cold_tier_restored_blocks_total", "mlxd_ssd_restored_blocks_total"),
                     ("mlxd_cold_tier_restored_bytes_total", "mlxd_ssd_restored_bytes_total"),
                     ("mlxd_cold_tier_restore_seconds_count", "mlxd_ssd_restore_seconds_count"),
                     ("mlxd_cold_tier_read_timeouts_total", "mlxd_ssd_read_timeouts_total")):
        assert (old, frozenset({("model", model_id)})) in last, old
        assert value(last, old, model=model_id) == value(last, new, model=model_id), old


def test_a_streaming_request_is_listed_live_and_counted_running(service: Service, model_id: str) -> None:
    """/admin/status lists it with its client, state and tokens; /metrics counts it running."""
    import threading

    body = {"model": model_id, "messages": [{"role": "user", "content": "Write a long story about a dragon."}],
            "max_tokens": 200, "temperature": 0, "stream": True}
    done = threading.Event()

    def stream() -> None:
        with httpx.stream("POST", f"{service.base_url}{CHAT}", json=body, timeout=120,
                          headers={"User-Agent": "live-list-test/1.0"}) as response:
            for _ in response.iter_lines():
                pass
        done.set()

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    seen: dict[str, Any] = {}

    def decoding() -> bool:
        requests = httpx.get(f"{service.base_url}/admin/status", timeout=10).json()["requests"]
        mine = [r for r in requests if r["user_agent"] == "live-list-test/1.0"]
        if mine and mine[0]["state"] == "decoding" and mine[0]["tok_s"]:
            seen.update(mine[0])
            seen["running"] = value(scrape(service), "mlxd_running_sequences", model=model_id)
            return True
        return done.is_set()

    wait_for(decoding, "the request decoding in the live list", timeout=60)
    assert seen, "the request finished before it was seen decoding for a second"
    assert seen["route"] == CHAT and seen["model"] == model_id and seen["prompt_tokens"] > 0
    assert seen["generated_tokens"] > 0 and seen["tokens"] == seen["generated_tokens"] and seen["tok_s"] > 0
    assert seen["running"] == 1
    thread.join(timeout=120)


def test_unload_and_load_are_counted(service: Service, model_id: str) -> None:
    before = scrape(service)
    assert httpx.post(f"{service.base_url}/admin/models/{model_id}/unload", timeout=120).status_code == 200
    middle = scrape(service)
    assert value(middle, "mlxd_model_state", model=model_id, state="unloaded") == 1
    assert value(middle, "mlxd_model_loaded", model=model_id) == 0
    assert httpx.post(f"{service.base_url}/admin/models/{model_id}/load", timeout=300).status_code == 200
    after = scrape(service)
    assert moved(before, after, "mlxd_model_unloads_total", model=model_id, reason="admin") == 1
    assert moved(before, after, "mlxd_model_loads_total", model=model_id) == 1
    assert moved(before, after, "mlxd_model_load_seconds_count", model=model_id) == 1
    assert value(after, "mlxd_model_loaded", model=model_id) == 1


def _status_command(service: Service, *extra: str) -> list[str]:
    return [sys.executable, "-m", "router", "status", "--home", str(service.home), "--port", str(service.port),
            "--watch", *extra]


def test_status_watch_redraws_until_its_count(service: Service, model_id: str) -> None:
    done = subprocess.run(_status_command(service, "--interval", "0.5", "--count", "3"), cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("Ctrl-C to stop") == 3
    frames = [frame for frame in done.stdout.split("Ctrl-C to stop\n") if frame.strip()]
    assert len(frames) == 3
    for frame in frames:
        lines = frame.strip().splitlines()
        assert lines[0].startswith("mlxd ") and f"127.0.0.1:{service.port}" in lines[0]
        assert lines[1].startswith("memory: ") and "[" in lines[1]
        assert lines[2].startswith("requests: ") and " served, " in lines[2]
        assert any(line.startswith(model_id) for line in lines)


def test_status_watch_stops_cleanly_on_ctrl_c(service: Service, model_id: str) -> None:
    process = subprocess.Popen(_status_command(service, "--interval", "0.3"), cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                               preexec_fn=ctrl_c_as_a_terminal_sends_it)
    assert process.stdout is not None
    seen = 0
    deadline = time.monotonic() + 60
    while seen < 2 and time.monotonic() < deadline:
        line = process.stdout.readline()
        seen += "Ctrl-C to stop" in line
    assert seen == 2, "two refreshes"
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 0 and "Traceback" not in err, err


def test_metrics_needs_the_admin_key_when_one_is_set(default_model_dir: Path, tmp_path: Path) -> None:
    svc = Service(["--model", str(default_model_dir), "--admin-key", "sk-admin-metrics", "--api-key", "sk-user"],
                  home=tmp_path)
    try:
        svc.wait_ready()
        assert httpx.get(f"{svc.base_url}/metrics").status_code == 401
        assert httpx.get(f"{svc.base_url}/metrics", headers={"Authorization": "Bearer sk-user"}).status_code == 403
        answer = httpx.get(f"{svc.base_url}/metrics", headers={"Authorization": "Bearer sk-admin-metrics"})
        assert answer.status_code == 200 and "mlxd_build_info" in answer.text
    finally:
        svc.stop()
