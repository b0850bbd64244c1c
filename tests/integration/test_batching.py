"""Continuous batching on the real default model: many clients, none waiting for another."""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from bench.common import eos_token_ids
from tests.integration.service import Service, running_service

pytestmark = pytest.mark.timeout(600)

def no_eos(model_dir: Path) -> dict[str, float]:
    """A logit_bias that keeps a request generating to its max_tokens (mlxd has no ignore_eos)."""
    return {str(i): -100 for i in eos_token_ids(model_dir)}


SALT = __name__  # this module's cache salts: no other module on the shared service uses them
TOPICS = ["the ocean", "volcanoes", "bread baking", "chess openings", "the moon",
          "honey bees", "railways", "glaciers"]


def ask(topic: str) -> list[dict]:
    return [{"role": "user", "content": f"Write three sentences about {topic}."}]


@pytest.fixture(scope="module")
def client(service) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{service.base_url}/v1", api_key="x", max_retries=0, timeout=300)


def greedy(client: openai.OpenAI, model_id: str, messages: list[dict], max_tokens: int = 24) -> str:
    r = client.chat.completions.create(model=model_id, messages=messages, temperature=0, max_tokens=max_tokens)
    return r.choices[0].message.content


def test_eight_concurrent_requests_equal_their_single_runs(client, model_id) -> None:
    alone = [greedy(client, model_id, ask(t)) for t in TOPICS]
    with ThreadPoolExecutor(len(TOPICS)) as pool:
        together = list(pool.map(lambda t: greedy(client, model_id, ask(t)), TOPICS))
    assert together == alone
    # and with a batched cold prefill: salted, so no block or tail of the runs above is reused
    with ThreadPoolExecutor(len(TOPICS)) as pool:
        cold = list(pool.map(lambda t: client.chat.completions.create(
            model=model_id, messages=ask(t), temperature=0, max_tokens=24,
            extra_body={"cache_salt": f"{SALT}-cold-{t}"}), TOPICS))
    assert all(r.usage.prompt_tokens_details is None or not r.usage.prompt_tokens_details.cached_tokens
               for r in cold), "a salted request reused cached tokens"
    assert [r.choices[0].message.content for r in cold] == alone


def timed_stream(client: openai.OpenAI, model_id: str, messages: list[dict], max_tokens: int,
                 stamps: list[float], **extra) -> dict:
    """Stream a greedy answer, appending each content chunk's arrival time to `stamps`."""
    final: dict = {}
    for chunk in client.chat.completions.create(model=model_id, messages=messages, temperature=0,
                                                max_tokens=max_tokens, stream=True, **extra):
        for choice in chunk.choices:
            if choice.delta.content:
                stamps.append(time.monotonic())
            if choice.finish_reason:
                final = (chunk.model_extra or {}).get("mlxd", {})
    return final


def long_prompt(num_words: int) -> list[dict]:
    words = " ".join(f"item{i % 97}" for i in range(num_words))
    return [{"role": "user", "content": f"Here is a list: {words}. Summarize it."}]


def test_long_prefill_never_freezes_running_streams(client, model_id, service) -> None:
    """A ~1.5K-token prompt arriving while 4 streams decode: no running stream waits
    longer than two prefill chunks for its next token."""
    chunk_tokens = 512
    # the prefill time of one chunk, measured here: the long prompt alone
    alone = timed_stream(client, model_id, long_prompt(500), 1, [])
    timings = alone["timings"]
    health = service.health()
    (worker,) = health["workers"].values()
    prompt_tokens = client.chat.completions.create(
        model=model_id, messages=long_prompt(500), max_tokens=1, temperature=0).usage.prompt_tokens
    assert 1200 <= prompt_tokens <= 2000
    chunk_s = timings["prefill_s"] / math.ceil(prompt_tokens / chunk_tokens)

    streams: list[list[float]] = [[] for _ in range(4)]
    threads = [
        threading.Thread(target=timed_stream, args=(client, model_id, ask(TOPICS[i]), 300, streams[i]),
                         kwargs={"extra_body": {"cache_salt": f"{SALT}-s{i}"}})
        for i in range(4)
    ]
    for t in threads:
        t.start()
    while min(len(s) for s in streams) < 5:  # all four are decoding
        time.sleep(0.05)
    arrived = time.monotonic()
    # a salt keeps the long prompt from hitting the blocks cached by the run above
    long_stamps: list[float] = []
    contended = timed_stream(client, model_id, long_prompt(500), 1, long_stamps,
                             extra_body={"cache_salt": f"{SALT}-fresh"})
    # a step that carries a chunk while 4 streams decode also runs their decode: on a busy
    # 2-core machine that step, not the chunk alone, is what a stream waits for. An
    # unchunked prefill still fails: its one step would be all the chunks (3-4 of them)
    num_chunks = math.ceil(prompt_tokens / chunk_tokens)
    chunk_s = max(chunk_s, contended["timings"]["prefill_s"] / num_chunks)
    for t in threads:
        t.join()
    first_long_token = long_stamps[0]
    worst = 0.0
    for stamps in streams:
        during = [b - a for a, b in zip(stamps, stamps[1:]) if b > arrived and a < first_long_token]
        assert during, "the long prefill did not overlap the running streams"
        worst = max(worst, max(during))
    assert worst < 2 * chunk_s, f"largest gap {worst:.2f}s >= 2 prefill chunks ({chunk_s:.2f}s each)"


def test_disconnecting_streams_frees_their_slots(client, model_id, service, default_model_dir: Path) -> None:
    bias = no_eos(default_model_dir)
    url = f"{service.base_url}/v1/chat/completions"
    stop_reading = [threading.Event() for _ in range(8)]
    counts = [0] * 8

    def read(i: int) -> None:
        # EOS biased away: the four kept streams must still be running when the worker's
        # pong reports them (answers that end at EOS finished first on AVX-512 kernels)
        body = {"model": model_id, "messages": ask(TOPICS[i]), "max_tokens": 400, "logit_bias": bias,
                "temperature": 0, "stream": True}
        with httpx.stream("POST", url, json=body, timeout=300) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    counts[i] += 1
                if stop_reading[i].is_set():
                    return  # leaving the block closes the connection

    mark = service.log_mark()
    threads = [threading.Thread(target=read, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while min(counts) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    (worker,) = service.health()["workers"].values()
    assert worker["num_requests"] == 8
    for i in range(4):
        stop_reading[i].set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        (worker,) = service.health()["workers"].values()
        if worker["num_requests"] == 4 and worker.get("worker_active") == 4:
            break
        time.sleep(0.2)
    assert worker["num_requests"] == 4
    assert worker["worker_active"] == 4  # counted by the worker itself
    for i in range(4, 8):
        stop_reading[i].set()
    for t in threads:
        t.join()
    deadline = time.monotonic() + 30  # the workers' lines can trail the answers in the pipe
    while service.log_since(mark).count("aborted after") < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert service.log_since(mark).count("aborted after") >= 4


BURST_WINDOW_MS = 300


@pytest.fixture(scope="module")
def small_service(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    # a batch window far above scheduling jitter, so the burst test below is deterministic
    with running_service(["--model", str(default_model_dir), "--max-num-seqs", "2", "--max-queue", "2",
                         "--batch-window-ms", str(BURST_WINDOW_MS)], tmp_path_factory.mktemp("home")) as svc:
        yield svc


def test_queue_bound_refuses_with_503_and_retry_after(small_service: Service, default_model_dir: Path) -> None:
    url = f"{small_service.base_url}/v1/chat/completions"
    model = httpx.get(f"{small_service.base_url}/v1/models").json()["data"][0]["id"]
    # long enough that all four are still running or queued when the worker's next pong
    # reports them (60 tokens took under a second on AVX-512 kernels: the pong never saw 4)
    body = {"model": model, "messages": ask("the sea"), "max_tokens": 300, "logit_bias": no_eos(default_model_dir),
            "temperature": 0}
    results: list[int] = []

    def run() -> None:
        results.append(httpx.post(url, json=body, timeout=300).status_code)

    threads = [threading.Thread(target=run) for _ in range(4)]  # max_num_seqs + max_queue
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        (worker,) = small_service.health()["workers"].values()
        if worker.get("worker_active") == 4:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the worker never reported its 4 slots and queue places taken: {worker}, {results}")
    refused = httpx.post(url, json=body, timeout=60)
    for t in threads:
        t.join()
    assert refused.status_code == 503
    assert refused.headers.get("retry-after")
    assert refused.json()["error"]["code"] == "queue_full"
    assert results == [200] * 4


def test_a_burst_of_requests_is_prefilled_in_one_step(small_service: Service) -> None:
    """The second request of a burst, arriving while the service would already be
    prefilling the first, joins that prefill (the worker's batch window): it does not wait
    a whole prefill behind the first."""
    client = openai.OpenAI(base_url=f"{small_service.base_url}/v1", api_key="x", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    salt = f"burst-{time.monotonic_ns()}"  # no prefix-cache hits: both prompts are prefilled
    go = threading.Barrier(2)

    def one(i: int) -> dict:
        go.wait()
        time.sleep(0.1 * i)  # well after the first request reached an idle worker
        r = client.chat.completions.create(model=model, messages=ask(TOPICS[i]), temperature=0, max_tokens=2,
                                           extra_body={"cache_salt": salt})
        return r.model_extra["mlxd"]["timings"]

    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(one, range(2))
    # one step ran both prefills and sampled both first tokens: same start, same end
    assert first["prefill_s"] == second["prefill_s"], (first, second)
    # the first waited for the second (~0.1 s), but never a window longer than BURST_WINDOW_MS
    assert 0.05 < first["queue_s"] < 0.1 + BURST_WINDOW_MS / 1000, first
    assert second["queue_s"] < BURST_WINDOW_MS / 1000, second
