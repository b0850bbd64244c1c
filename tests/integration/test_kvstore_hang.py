"""A hung kvstore (SIGSTOP) on the real service: the router's pings find it and kill and
restart it, /health shows it, and meanwhile the running streams never wait for it: SSD
reads happen on the worker's tokenizer thread, and after one timeout they are skipped for
a back-off instead of costing every new prompt the timeout. Service goes on afterwards."""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest

from tests.integration.service import Service, running_service

pytestmark = pytest.mark.timeout(300)

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 3.0  # ColdTier's default: what each SSD read to a hung kvstore used to cost
NUM_PROMPTS = 4
# --kvstore-ping-timeout-s: the restart comes after the burst's NUM_PROMPTS reads, so the
# worker's back-off is what is measured, not the restart cutting the stall short
PING_TIMEOUT_S = 12.0
# Small blocks: short prompts reach the cold tier, and their prefill costs little next to the
# read timeouts measured here (and does not swing with the load on the machine).
BLOCK_TOKENS = 16


def prompt(topic: str) -> list[dict[str, str]]:
    """A few blocks long, so the worker looks for them on SSD when they are not hot."""
    return [{"role": "user", "content": f"About {topic}: list three facts about rivers, lakes and the sea."}]


@pytest.fixture(scope="module")
def service(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with running_service(["--model", str(default_model_dir), "--heartbeat-s", "0.5",
                          "--block-tokens", str(BLOCK_TOKENS), "--kvstore-ping-timeout-s", str(PING_TIMEOUT_S)],
                         tmp_path_factory.mktemp("home")) as svc:
        yield svc


class Stream:
    """A long greedy stream whose token arrival times are recorded, on a thread; `stop()`
    lets a few more tokens arrive, then closes it (aborting the request)."""

    def __init__(self, client: openai.OpenAI, model: str) -> None:
        self.times: list[float] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(client, model))
        self._thread.start()
        while len(self.times) < 5:
            assert self._thread.is_alive(), "the stream ended early"
            time.sleep(0.05)

    def _run(self, client: openai.OpenAI, model: str) -> None:
        stream = client.chat.completions.create(
            model=model, stream=True, max_tokens=400, temperature=0,
            messages=[{"role": "user", "content": "Write a very long story about a dragon."}],
        )
        num_after_stop = 0
        with stream:
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    self.times.append(time.monotonic())
                    num_after_stop += self._stopping.is_set()
                    if num_after_stop == 5:
                        return

    def stop(self) -> float:
        """The largest gap between two tokens; asserts the stream outlived the measurement."""
        self._stopping.set()
        self._thread.join(timeout=120)
        assert not self._thread.is_alive()
        return max(b - a for a, b in zip(self.times, self.times[1:]))


def largest_gap_during_a_burst(client: openai.OpenAI, model: str, tag: str,
                               before_burst: Callable[[], None] = lambda: None) -> float:
    """While a stream runs, NUM_PROMPTS new prompts arrive together, each a hot-tier miss
    that the worker looks up on SSD; returns the stream's largest gap between tokens."""
    stream = Stream(client, model)
    before_burst()

    def ask(i: int) -> str:
        answer = client.chat.completions.create(model=model, messages=prompt(f"{tag} {i}"),
                                                temperature=0, max_tokens=4)
        return answer.choices[0].message.content or ""

    with concurrent.futures.ThreadPoolExecutor(NUM_PROMPTS) as pool:
        assert all(pool.map(ask, range(NUM_PROMPTS)))
    return stream.stop()


def first_time_down(service: Service, pid: int, seen: dict) -> None:
    """Poll /health until the kvstore is no longer the ready `pid`; note when (after
    seen["stopped_at"]) and what it showed."""
    while time.monotonic() - seen["stopped_at"] < PING_TIMEOUT_S + 30:
        kv = service.health()["kvstore"]
        if kv["state"] != "ready" or kv["pid"] != pid:
            seen.update(kv, after_s=time.monotonic() - seen["stopped_at"])
            return
        time.sleep(0.1)


def test_a_hung_kvstore_is_killed_and_never_stalls_the_streams(service: Service) -> None:
    client = openai.OpenAI(base_url=f"{service.base_url}/v1", api_key="x", max_retries=0, timeout=120)
    model = client.models.list().data[0].id

    def ask(messages: list[dict[str, str]], max_tokens: int = 16) -> str:
        answer = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=max_tokens)
        return answer.choices[0].message.content or ""

    greedy = ask(prompt("greedy"))
    # what a burst of new prompts costs the stream anyway (their prefill), measured in this run
    baseline_gap = largest_gap_during_a_burst(client, model, "healthy")
    kvstore = service.health()["kvstore"]
    assert kvstore["state"] == "ready" and kvstore["last_ping_s"] is not None and kvstore["last_ping_s"] < 2
    pid = kvstore["pid"]
    down: dict = {}
    watcher = threading.Thread(target=first_time_down, args=(service, pid, down))

    def hang_the_kvstore() -> None:
        os.kill(pid, signal.SIGSTOP)
        down["stopped_at"] = time.monotonic()
        watcher.start()

    try:
        hung_gap = largest_gap_during_a_burst(client, model, "hung", hang_the_kvstore)
        watcher.join()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    log.info("largest token gap during %d new prompts: %.2f s with the kvstore up, %.2f s with it hung; "
             "kvstore seen down: %s", NUM_PROMPTS, baseline_gap, hung_gap, down)
    # the reads did wait for the hung kvstore (on the tokenizer thread)...
    assert "did not answer within" in service.log_text(), "no SSD read was attempted while it hung"
    # ...and the stream never did: not one read timeout on the engine loop (it used to pay
    # one per prompt, NUM_PROMPTS * READ_TIMEOUT_S)
    assert hung_gap < baseline_gap + READ_TIMEOUT_S / 2
    assert "after_s" in down, "the hung kvstore was not noticed"
    assert down["after_s"] < PING_TIMEOUT_S + 2.0
    assert "killed as hung" in (down["last_error"] or "")

    deadline = time.monotonic() + 60
    while (kv := service.health()["kvstore"])["state"] != "ready":
        assert time.monotonic() < deadline, f"kvstore not restarted: {kv}"
        time.sleep(0.2)
    assert kv["pid"] not in (None, pid) and kv["restarts"] == 1
    assert "killed as hung" in kv["last_error"]

    assert ask(prompt("greedy")) == greedy
    # once its back-off is over, the worker reads from the new kvstore again
    deadline = time.monotonic() + 60
    for i in itertools.count():
        if "SSD reads resume" in service.log_text():
            break
        assert time.monotonic() < deadline, "SSD reads did not resume"
        ask(prompt(f"after {i}"), 2)
        time.sleep(1.0)
