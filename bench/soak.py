"""Soak (and, with --chaos, fault) test of one mlxd service with one or two chat models.

N clients send a mix of every dialect the service speaks (OpenAI chat streamed and not,
completions, Anthropic Messages and count_tokens, OpenAI Responses), tool calls,
structured output and streams cancelled halfway, over shared long prefixes and unique
prompts, while an admin poller reads /health, /admin/status and /admin/cache. Every
request ends as ok, failed with a clear error (an error body or event in the API's
shape; counted by status and type), failed without one, wrong (a 200 whose answer breaks
what was asked: no tool call, JSON that does not parse), or hung (no byte for --hung-s).

Greedy probe prompts are answered from scratch (salted: no cache) before the clients
start; with --chaos, every --chaos-every-s a random fault (SIGKILL or SIGSTOP/SIGCONT of a
worker or the kvstore, an admin restart, the cold tier's disk filled)
is followed, once /health is ok again, by a replay of the probes, which must match token
for token (replays run beside the fault loop, each one covering the faults struck since
the previous began, so a replay that queues behind the clients does not space the faults
out). Every process's RSS, open files and threads are read at start, after warm-up
and at the end. One JSON object on stdout (and --out).

    python bench/soak.py --clients 10 --duration-s 120 --chaos
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import emit, log, mlxd_server, percentile  # noqa: E402

DEFAULT_MODELS = ("SmolLM2-135M-Instruct", "qwen2.5-coder-0.5b")
SHARED_PREFIX = ("You are a meticulous assistant for a software team. " +
                 " ".join(f"Guideline {i}: keep answers about subsystem {i} short, precise and polite."
                          for i in range(60)))
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
PROBES = ["What is the capital of France?", "Name three primary colours.", "What is 12 times 12?"]
FAULTS = ("sigkill_worker", "sigstop_worker", "sigkill_kvstore", "sigstop_kvstore", "admin_restart", "disk_full")
KINDS = ["chat_stream", "chat", "completion", "completion_stream", "messages_stream", "messages", "responses_stream",
         "tool_call", "structured", "cancel", "count_tokens"]


# ---------------------------------------------------------------- requests


@dataclass
class Outcome:
    kind: str
    model: str
    result: str  # ok | failed_clear | failed_unclear | wrong | hung
    detail: str = ""  # the status and error type, or what was wrong
    ttft_s: float | None = None
    latency_s: float = 0.0


def _prompt(rng: random.Random, shared: bool) -> str:
    topic = f"{uuid.uuid4().hex[:8]} item {rng.randrange(10_000)}"
    question = f"In one sentence, what is {topic}?"
    return f"{SHARED_PREFIX}\n\n{question}" if shared else question


def _error_detail(status: int, body: Any) -> str | None:
    """`status:type` when `body` is an error in OpenAI's or Anthropic's shape, else None."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("type"), str) and isinstance(error.get("message"), str):
            return f"{status}:{error.get('code') or error['type']}"
    return None


def _sse_error(data: Any) -> str | None:
    """An error carried by an SSE event (after the stream started)."""
    if isinstance(data, dict):
        if data.get("type") == "error" or "error" in data and data.get("error"):
            detail = _error_detail(200, data if "error" in data else {"error": data})
            return detail or "200:stream_error"
        if data.get("type") == "response.failed":
            return f"200:{(data.get('response') or {}).get('error', {}).get('code', 'response_failed')}"
    return None


class Client:
    """One simulated user: requests one after another until the run ends."""

    def __init__(self, base_url: str, models: list[str], hung_s: float, max_tokens: int, seed: int) -> None:
        self.base_url = base_url
        self.models = models
        self.max_tokens = max_tokens
        self.rng = random.Random(seed)
        self.http = httpx.Client(base_url=base_url, timeout=httpx.Timeout(hung_s, connect=30.0))

    def one(self) -> Outcome:
        kind = self.rng.choice(KINDS)
        model = self.rng.choice(self.models)
        shared = self.rng.random() < 0.5
        started = time.monotonic()
        outcome = Outcome(kind, model, "ok")
        try:
            getattr(self, f"_{kind}")(model, _prompt(self.rng, shared), outcome, started)
        except httpx.TimeoutException as exc:
            outcome.result, outcome.detail = "hung", type(exc).__name__
        except httpx.HTTPError as exc:
            outcome.result, outcome.detail = "failed_unclear", f"transport:{type(exc).__name__}"
        outcome.latency_s = time.monotonic() - started
        return outcome

    # each method fills `outcome` (result stays "ok" unless something says otherwise)

    def _post(self, path: str, body: dict, outcome: Outcome) -> Any:
        answer = self.http.post(path, json=body)
        try:
            data = answer.json()
        except ValueError:
            data = None
        if answer.status_code != 200 or _error_detail(answer.status_code, data):
            detail = _error_detail(answer.status_code, data)
            outcome.result = "failed_clear" if detail else "failed_unclear"
            outcome.detail = detail or f"{answer.status_code}:unparseable"
            return None
        if data is None:
            outcome.result, outcome.detail = "wrong", "200 with a body that is not JSON"
        return data

    def _stream(self, path: str, body: dict, outcome: Outcome, started: float, cancel_after: int = 0) -> list[Any]:
        """The stream's data events; stops after `cancel_after` events when set."""
        events: list[Any] = []
        with self.http.stream("POST", path, json={**body, "stream": True}) as answer:
            if answer.status_code != 200:
                answer.read()
                try:
                    data = answer.json()
                except ValueError:
                    data = None
                detail = _error_detail(answer.status_code, data)
                outcome.result = "failed_clear" if detail else "failed_unclear"
                outcome.detail = detail or f"{answer.status_code}:unparseable"
                return events
            for line in answer.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                error = _sse_error(data)
                if error:
                    outcome.result, outcome.detail = "failed_clear", error
                    return events
                if outcome.ttft_s is None and _has_output(data):
                    outcome.ttft_s = time.monotonic() - started
                events.append(data)
                if cancel_after and len(events) >= cancel_after:
                    return events  # leaving the block closes the connection mid-stream
        return events

    def _chat_stream(self, model: str, prompt: str, outcome: Outcome, started: float) -> None:
        events = self._stream("/v1/chat/completions", {"model": model, "max_tokens": self.max_tokens,
                                                       "messages": [{"role": "user", "content": prompt}]},
                              outcome, started)
        if outcome.result == "ok" and not any(c.get("choices") and c["choices"][0].get("finish_reason")
                                              for c in events):
            outcome.result, outcome.detail = "failed_unclear", "stream ended without a finish_reason"

    def _chat(self, model: str, prompt: str, outcome: Outcome, started: float) -> None:
        data = self._post("/v1/chat/completions", {"model": model, "max_tokens": self.max_tokens,
                                                   "messages": [{"role": "user", "content": prompt}]}, outcome)
        if data is not None and not isinstance(data["choices"][0]["message"].get("content"), str):
            outcome.result, outcome.detail = "wrong", "no content"

    def _completion(self, model: str, prompt: str, outcome: Outcome, started: float) -> None:
        data = self._post("/v1/completions", {"model": model, "max_tokens": self.max_tokens, "prompt": prompt},
                          outcome)
        if data is not None and not isinstance(data["choices"][0].get("text"), str):
            outcome.result, outcome.detail = "wrong", "no text"

    def _completion_stream(self, model: str, prompt: str, outcome: Outcome, started: float) -> None:
        self._stream("/v1/completions", {"model": model, "max_tokens": self.max_tokens, "prompt": prompt},
                     outcome, started)

    def _messages_stream(self, model: str, prompt: str, outcome: Outcome, started: float) -> None:
        events = self._stream("/v1/messages", {"model": model, "max_tokens": self.max_tokens,
                                               "messages": [{"role": "user", "content": prompt}]}, outcome, started)
        if outcome.result == "ok" and not any(e.get("type") == "message_stop" for e in events):
            outcome.result, outcome.detail = "failed_unclear", "stream ended without message_stop"

    def _messages(self, model: str, prompt: str, outcome: Outcome, started: float) -> None:
        data = self._post("/v1/messages", {"model": model, "max_tokens": self.max_tokens, "system": SHARED_PREFIX,
                                           "messages": [{"role": "user", "content": prompt[-80:]}]}, outcome)
        if data is not None and data.get("type") != "message":
            outcome.result, outcome.detail = "wrong", "not a message"

    def _responses_stream(self, model: str, prompt: str, outcome: Outcome, started: float) -> None:
        events = self._stream("/v1/responses", {"model": model, "max_output_tokens": self.max_tokens,
                                                "input": prompt, "store": False}, outcome, started)
        if outcome.result == "ok" and not any(e.get("type") in ("response.completed", "response.incomplete")
                                              for e in events):
            outcome.result, outcome.detail = "failed_unclear", "stream ended without response.completed"

    def _tool_call(self, model: str, prompt: str, outcome: Outcome, started: float) -> None:
        city = self.rng.choice(["Paris", "Oslo", "Lima", "Kyoto"])
        data = self._post("/v1/chat/completions", {
            "model": model, "max_tokens": 64, "tools": TOOLS, "tool_choice": "required",
            "messages": [{"role": "user", "content": f"What is the weather in {city}?"}]}, outcome)
        if data is None or data["choices"][0]["finish_reason"] == "length":
            return  # cut by max_tokens (a small model may write a long argument): nothing to check
        calls = data["choices"][0]["message"].get("tool_calls") or []
        try:
            ok = bool(calls) and calls[0]["function"]["name"] == "get_weather" and isinstance(
                json.loads(calls[0]["function"]["arguments"]), dict)
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            outcome.result, outcome.detail = "wrong", "tool_choice required gave no valid call"

    def _structured(self, model: str, prompt: str, outcome: Outcome, started: float) -> None:
        data = self._post("/v1/chat/completions", {
            "model": model, "max_tokens": 48, "messages": [{"role": "user", "content": "Describe a person as JSON."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}},
            outcome)
        if data is None:
            return
        choice = data["choices"][0]
        if choice["finish_reason"] == "length":
            return  # cut by max_tokens: nothing to check
        try:
            value = json.loads(choice["message"]["content"])
            ok = isinstance(value, dict) and set(value) == {"name", "age"} and isinstance(value["age"], int)
        except (ValueError, TypeError):
            ok = False
        if not ok:
            outcome.result, outcome.detail = "wrong", "json_schema output does not match"

    def _cancel(self, model: str, prompt: str, outcome: Outcome, started: float) -> None:
        self._stream("/v1/chat/completions", {"model": model, "max_tokens": 200,
                                              "messages": [{"role": "user", "content": prompt}]},
                     outcome, started, cancel_after=3)

    def _count_tokens(self, model: str, prompt: str, outcome: Outcome, started: float) -> None:
        data = self._post("/v1/messages/count_tokens", {"model": model,
                                                        "messages": [{"role": "user", "content": prompt}]}, outcome)
        if data is not None and not (isinstance(data.get("input_tokens"), int) and data["input_tokens"] > 0):
            outcome.result, outcome.detail = "wrong", "no input_tokens"


def _has_output(data: dict) -> bool:
    """Whether an SSE event carries generated output (for time to first token)."""
    for choice in data.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("tool_calls") or choice.get("text"):
            return True
    if data.get("type") == "content_block_delta":
        return bool((data.get("delta") or {}).get("text"))
    return data.get("type") == "response.output_text.delta"


# ---------------------------------------------------------------- probes


class ProbeFailed(Exception):
    """A probe got an error instead of an answer (a fault's tail): retried, never a mismatch."""


def probe_answers(base_url: str, models: list[str], salt: str | None) -> dict[str, list[int] | str]:
    """Each model's greedy answer to each probe, token for token (each token's bytes, from
    logprobs) and as text, over the shared prefix so the prefix cache serves them;
    `salt` makes them uncached."""
    answers: dict[str, Any] = {}
    with httpx.Client(base_url=base_url, timeout=180) as http:
        for model in models:
            for probe in PROBES:
                body: dict[str, Any] = {"model": model, "temperature": 0, "max_tokens": 16, "logprobs": True,
                                        "messages": [{"role": "system", "content": SHARED_PREFIX},
                                                     {"role": "user", "content": probe}]}
                if salt:
                    body["cache_salt"] = salt
                answer = http.post("/v1/chat/completions", json=body)
                answer.raise_for_status()
                parsed = answer.json()
                if "error" in parsed:  # a padded 200 whose worker failed after the status went out
                    raise ProbeFailed(f"{model}: {parsed['error']}")
                choice = parsed["choices"][0]
                tokens = [t["bytes"] for t in choice["logprobs"]["content"]]
                answers[f"{model}|{probe}"] = {"text": choice["message"]["content"], "tokens": tokens}
    return answers


# ---------------------------------------------------------------- processes


def process_table(router_pid: int, base_url: str) -> dict[str, dict[str, Any]]:
    """RSS, open files and threads of the router and each of its children, by role; for
    workers also their hot tier's bytes, so RSS growth can be told from the cache filling."""
    table: dict[str, dict[str, Any]] = {}
    hot: dict[str, int] = {}
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
        for entry in httpx.get(f"{base_url}/admin/status", timeout=10).json()["models"]:
            if entry.get("hot_tier"):
                hot[f"worker[{entry['id']}]"] = entry["hot_tier"]["bytes"]
    try:
        router = psutil.Process(router_pid)
        procs = [router, *router.children(recursive=True)]
    except psutil.NoSuchProcess:
        return table
    for proc in procs:
        try:
            cmd = proc.cmdline()
            if proc.pid == router_pid:
                role = "router"
            elif "kvstore" in cmd:
                role = "kvstore"
            elif "worker" in cmd:
                role = f"worker[{cmd[cmd.index('--identity') + 1].split('#')[0]}]" if "--identity" in cmd \
                    else f"worker[{proc.pid}]"
            else:
                role = f"other[{proc.pid}]"
            with proc.oneshot():
                table[role] = {"pid": proc.pid, "rss_bytes": proc.memory_info().rss,
                               "open_files": proc.num_fds(), "threads": proc.num_threads()}
            if role in hot:
                table[role]["hot_tier_bytes"] = hot[role]
        except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError, IndexError):
            continue
    return table


# ---------------------------------------------------------------- chaos


class Disk:
    """The cold tier's directory on a tmpfs of its own, so it can be made read-only or full
    (also for root, whom chmod does not stop). Unavailable (None) without mount rights."""

    def __init__(self, size_mb: int) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="mlxd-soak-kv-"))
        self.size_mb = size_mb
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", "tmpfs", str(self.path)],
                              capture_output=True, text=True)
        self.mounted = done.returncode == 0
        if not self.mounted:
            log("no tmpfs for the cold tier (%s); the disk faults are skipped", done.stderr.strip())

    def read_only(self, on: bool) -> None:
        subprocess.run(["mount", "-o", f"remount,{'ro' if on else 'rw'}", str(self.path)], check=True)

    def fill(self, on: bool) -> None:
        filler = self.path / "filler"
        if on:
            with open(filler, "wb") as out, contextlib.suppress(OSError):
                while True:
                    out.write(b"\0" * (1 << 20))
        else:
            filler.unlink(missing_ok=True)

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], check=False)
        with contextlib.suppress(OSError):
            self.path.rmdir()


class Chaos:
    """Faults, one at a time, each followed by recovery and the probe replay."""

    def __init__(self, base_url: str, models: list[str], disk: Disk | None, rng: random.Random,
                 expected: dict[str, Any], only: list[str] | None = None) -> None:
        self.base_url = base_url
        self.models = models
        self.disk = disk
        self.rng = rng
        self.expected = expected
        self.only = only
        self.events: list[dict[str, Any]] = []
        self.http = httpx.Client(base_url=base_url, timeout=120)

    def actions(self) -> list[str]:
        names = [f for f in FAULTS if f != "disk_full"]
        if self.disk is not None and self.disk.mounted:
            # not "read-only": a remount ro of the tmpfs is refused (EBUSY) while the kvstore
            # holds segments open for writing; a full disk is the fault a user meets anyway
            names += ["disk_full"]
        return [n for n in names if n in self.only] if self.only else names

    def _worker_pid(self, model: str) -> int | None:
        return (self.http.get("/health").json().get("workers", {}).get(model) or {}).get("pid")

    def _kvstore_pid(self) -> int | None:
        return (self.http.get("/admin/status").json().get("kvstore") or {}).get("pid")

    def strike(self) -> dict[str, Any]:
        action = self.rng.choice(self.actions())
        model = self.rng.choice(self.models)
        event: dict[str, Any] = {"action": action, "at": time.strftime("%H:%M:%S")}
        try:
            if action in ("sigkill_worker", "sigstop_worker"):
                event["target"] = model
                pid = self._worker_pid(model)
                if pid:
                    self._signal(pid, action)
            elif action in ("sigkill_kvstore", "sigstop_kvstore"):
                event["target"] = "kvstore"
                pid = self._kvstore_pid()
                if pid:
                    self._signal(pid, action)
            elif action == "admin_restart":
                event["target"] = model
                event["status"] = self.http.post(f"/admin/workers/{model}/restart").status_code
            elif action == "disk_read_only":
                assert self.disk is not None
                self.disk.read_only(True)
                time.sleep(self.rng.uniform(5, 15))
                self.disk.read_only(False)
            elif action == "disk_full":
                assert self.disk is not None
                self.disk.fill(True)
                time.sleep(self.rng.uniform(5, 15))
                self.disk.fill(False)
        except (httpx.HTTPError, OSError, subprocess.CalledProcessError) as exc:
            event["error"] = repr(exc)
        event.update(self._recover())
        self.events.append(event)
        log("chaos: %s", event)
        return event

    def _signal(self, pid: int, action: str) -> None:
        if action.startswith("sigkill"):
            os.kill(pid, signal.SIGKILL)
            return
        os.kill(pid, signal.SIGSTOP)
        time.sleep(self.rng.uniform(3, 12))
        with contextlib.suppress(ProcessLookupError):  # a supervisor may have killed it as hung meanwhile
            os.kill(pid, signal.SIGCONT)

    def _recover(self) -> dict[str, Any]:
        """Wait until /health says ok again (up to 300 s): how long the service took."""
        started = time.monotonic()
        while time.monotonic() - started < 300:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                health = self.http.get("/health", timeout=10).json()
                if health.get("status") == "ok":
                    return {"recovered": True, "recovered_s": round(time.monotonic() - started, 2)}
            time.sleep(0.5)
        return {"recovered": False}

    def replay(self) -> dict[str, Any]:
        """The greedy probes again, against the answers recorded from scratch."""
        errors = []
        for attempt in range(10):  # a probe may meet a fault (a 503, a worker killed mid-answer): retry
            try:
                got = probe_answers(self.base_url, self.models, None)
                break
            except (httpx.HTTPError, ProbeFailed, ValueError) as exc:
                errors.append(repr(exc)[:200])
                self._recover()
                time.sleep(2)
        else:
            return {"probes": "failed to run", "probe_errors": errors}
        wrong = [key for key, answer in got.items() if answer != self.expected[key]]
        return {"probes_match": not wrong, "probes_wrong": wrong}

    def _recover_and_probe(self) -> dict[str, Any]:
        recovered = self._recover()
        return {**recovered, **self.replay()} if recovered["recovered"] else recovered


class Replayer(threading.Thread):
    """Replays the probes after faults without holding up the next one: under 50 clients
    a replay waits its turn in the workers' queues for minutes, and a chaos loop that
    waited for it struck once in ten minutes. Each replay answers for every fault struck
    since the previous replay began (their events get its verdict)."""

    def __init__(self, chaos: Chaos) -> None:
        super().__init__(name="probe-replayer", daemon=True)
        self.chaos = chaos
        self.replays: list[dict[str, Any]] = []
        self._waiting: list[dict[str, Any]] = []
        self._ready = threading.Condition()
        self._closing = False

    def after(self, event: dict[str, Any]) -> None:
        with self._ready:
            self._waiting.append(event)
            self._ready.notify()

    def close(self, timeout_s: float) -> None:
        with self._ready:
            self._closing = True
            self._ready.notify()
        self.join(timeout_s)

    def run(self) -> None:
        while True:
            with self._ready:
                while not self._waiting and not self._closing:
                    self._ready.wait()
                if not self._waiting:
                    return
                covered, self._waiting = self._waiting, []
            started = time.monotonic()
            try:
                verdict = self.chaos.replay()
            except Exception as exc:  # the harness's own bug must not end the replays silently
                verdict = {"probes": f"replay crashed: {exc!r}"[:300]}
            verdict["replay_s"] = round(time.monotonic() - started, 1)
            for event in covered:
                event.update(verdict)
            self.replays.append({"faults": [e["action"] + "@" + e["at"] for e in covered], **verdict})
            log("probe replay after %d fault(s): %s", len(covered), verdict)


# ---------------------------------------------------------------- the run


@dataclass
class Tally:
    outcomes: list[Outcome] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, outcome: Outcome) -> None:
        with self.lock:
            self.outcomes.append(outcome)


def _client_loop(client: Client, tally: Tally, stop: threading.Event) -> None:
    while not stop.is_set():
        tally.add(client.one())


def _admin_poller(base_url: str, stop: threading.Event, counts: collections.Counter) -> None:
    with httpx.Client(base_url=base_url, timeout=30) as http:
        n = 0
        while not stop.wait(2.0):
            n += 1
            for path in ("/health", "/admin/status") + (("/admin/cache",) if n % 5 == 0 else ()):
                try:
                    answer = http.get(path)
                    answer.json()
                    counts["ok" if answer.status_code in (200, 503) else f"status_{answer.status_code}"] += 1
                except (httpx.HTTPError, ValueError) as exc:
                    counts[f"error_{type(exc).__name__}"] += 1


def _model_dirs(args: argparse.Namespace) -> list[Path]:
    root = Path(args.model_dir or Path(os.environ.get("MLXD_TEST_HOME", ".cache/test-home")) / "models")
    return [Path(m) if "/" in m else root / m for m in args.models]


def _summary(tally: Tally) -> dict[str, Any]:
    outcomes = tally.outcomes
    by_result = collections.Counter(o.result for o in outcomes)
    details: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for o in outcomes:
        if o.result != "ok":
            details[o.result][f"{o.kind} {o.detail}"] += 1
    ttfts = [o.ttft_s for o in outcomes if o.result == "ok" and o.ttft_s is not None]
    latencies = [o.latency_s for o in outcomes if o.result == "ok"]
    return {
        "total": len(outcomes), "ok": by_result["ok"], "failed_clear": by_result["failed_clear"],
        "failed_unclear": by_result["failed_unclear"], "wrong": by_result["wrong"], "hung": by_result["hung"],
        "details": {k: dict(v) for k, v in details.items()},
        "by_kind": dict(collections.Counter(o.kind for o in outcomes)),
        "by_model": dict(collections.Counter(o.model for o in outcomes)),
        "ttft_s": {"p50": _r(percentile(ttfts, 50)), "p99": _r(percentile(ttfts, 99)), "n": len(ttfts)},
        "latency_s": {"p50": _r(percentile(latencies, 50)), "p99": _r(percentile(latencies, 99)), "n": len(latencies)},
    }


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _growth(warm: dict[str, dict], end: dict[str, dict]) -> dict[str, Any]:
    """RSS growth after warm-up per role; a role whose process was replaced is marked so."""
    growth = {}
    for role, before in warm.items():
        after = end.get(role)
        if after is None:
            growth[role] = None
        else:
            growth[role] = {"rss_growth": round(after["rss_bytes"] / before["rss_bytes"] - 1, 4),
                            "same_process": after["pid"] == before["pid"]}
    return growth


def run(args: argparse.Namespace) -> dict[str, Any]:
    model_dirs = _model_dirs(args)
    names = [d.name for d in model_dirs]
    disk_faults = args.chaos and (not args.faults or "disk_full" in args.faults)
    disk = Disk(args.disk_mb) if disk_faults else None
    # one --model (the flag is not repeatable); a second is pinned from its directory, so it loads at start
    extra = (["--model-dir", str(model_dirs[1].parent), *(arg for d in model_dirs[1:] for arg in ("--pin", d.name))]
             if len(model_dirs) > 1 else [])
    # a hot tier that fills during the warm-up, so RSS after it measures leaks, not the cache filling
    extra += ["--max-output-tokens", "256", "--shutdown-drain-s", "2", "--hot-tier-bytes", str(args.hot_tier_mb << 20)]
    if disk is not None and disk.mounted:
        extra += ["--kvstore-dir", str(disk.path), "--max-disk-bytes", str(disk.size_mb * 6 // 10 << 20)]
    try:
        with mlxd_server(model_dirs[0], extra_args=extra, name="soak") as server:
            router_pid = server.process.pid
            result: dict[str, Any] = {"scenario": "soak", "clients": args.clients, "duration_s": args.duration_s,
                                      "chaos": args.chaos, "models": names, "hung_s": args.hung_s}
            processes = {"start": process_table(router_pid, server.base_url)}
            log("recording the probes from scratch")
            expected = probe_answers(server.base_url, names, f"scratch-{uuid.uuid4().hex}")
            first = probe_answers(server.base_url, names, None)  # fills the cache; must equal scratch already
            log("probes recorded; %d clients start", args.clients)
            result["probes"] = {"count": len(expected), "first_cached_match": first == expected}
            tally = Tally()
            stop = threading.Event()
            poller_counts: collections.Counter = collections.Counter()
            threads = [threading.Thread(target=_client_loop, daemon=True, args=(
                Client(server.base_url, names, args.hung_s, args.max_tokens, seed=i), tally, stop))
                for i in range(args.clients)]
            threads.append(threading.Thread(target=_admin_poller, args=(server.base_url, stop, poller_counts),
                                            daemon=True))
            started = time.monotonic()
            for thread in threads:
                thread.start()
            rng = random.Random(args.seed)
            chaos = Chaos(server.base_url, names, disk, rng, expected, args.faults) if args.chaos else None
            replayer = Replayer(chaos) if chaos is not None else None
            if replayer is not None:
                replayer.start()
            warm_at = started + args.warmup_s
            next_fault = started + args.warmup_s + args.chaos_every_s
            while time.monotonic() - started < args.duration_s:
                if "warm" not in processes and time.monotonic() >= warm_at:
                    processes["warm"] = process_table(router_pid, server.base_url)
                    log("warm: %s", processes["warm"])
                if chaos is not None and replayer is not None and time.monotonic() >= next_fault:
                    replayer.after(chaos.strike())
                    next_fault = time.monotonic() + args.chaos_every_s
                time.sleep(0.5)
            stop.set()
            for thread in threads:
                thread.join(args.hung_s + 30)
            result["still_running_clients"] = sum(t.is_alive() for t in threads)
            if chaos is not None and replayer is not None:  # the last word on wrong answers, after the load is gone
                replayer.close(600)
                result["final_probes_match"] = chaos._recover_and_probe().get("probes_match")
            processes.setdefault("warm", processes["start"])
            processes["end"] = process_table(router_pid, server.base_url)
            result["requests"] = _summary(tally)
            result["wall_s"] = round(time.monotonic() - started, 1)
            result["admin_poller"] = dict(poller_counts)
            result["processes"] = processes
            result["rss_growth_after_warmup"] = _growth(processes["warm"], processes["end"])
            if chaos is not None:
                faults = chaos.events
                result["faults"] = {"count": len(faults),
                                    "by_action": dict(collections.Counter(e["action"] for e in faults)),
                                    "not_recovered": sum(not e.get("recovered") for e in faults),
                                    "verified_by_a_replay": sum("probes_match" in e for e in faults),
                                    "probe_mismatches": sum(e.get("probes_match") is False for e in faults),
                                    "replays": replayer.replays if replayer is not None else [],
                                    "events": faults}
                result["disk_faults"] = bool(disk is not None and disk.mounted)
            return result
    finally:
        if disk is not None:
            disk.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--duration-s", type=float, default=120.0)
    parser.add_argument("--warmup-s", type=float, default=30.0, help="RSS baseline after this long")
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS),
                        help="chat models (one or two): names in --model-dir, or directories")
    parser.add_argument("--model-dir", default=None, help="default: $MLXD_TEST_HOME/models")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--hung-s", type=float, default=60.0, help="no byte for this long is a hung request")
    parser.add_argument("--chaos", action="store_true")
    parser.add_argument("--chaos-every-s", type=float, default=20.0)
    parser.add_argument("--faults", nargs="+", choices=FAULTS, default=None,
                        help="strike only these faults (default: all; disk_full needs a tmpfs mount)")
    parser.add_argument("--disk-mb", type=int, default=256, help="size of the cold tier's tmpfs under --chaos")
    parser.add_argument("--hot-tier-mb", type=int, default=128, help="each worker's hot tier")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    emit(run(args), args.out)


if __name__ == "__main__":
    main()
