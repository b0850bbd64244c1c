"""Continuous batching: does throughput grow with concurrent clients, and at what TTFT?

N = 1, 2, 4, 8 concurrent streaming clients, each with its own ~300-token raw prompt and
128 greedy tokens (EOS biased away so every request runs to its limit), against
(a) mlxd over HTTP, (b) mlx-lm's BatchGenerator in-process on the same prompts (the
engine's ceiling) and (c) `mlx_lm.server` with the same fp32 weights and BLAS (the peer).
All three stay loaded for the whole run and take turns at each N, so drift in the speed
of a shared machine lands on all of them alike; every N is measured `--repeats` times
on fresh prompts and each figure is the median (each repeat's own figures are listed
beside it). Prints one JSON object on stdout; progress on stderr. `--help` lists the flags.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import (
    emit,
    PYTHON,
    REPO,
    CpuMeter,
    Server,
    blas_path,
    environment,
    eos_token_ids,
    log,
    median_of_runs,
    mlxd_server,
    peer_server,
    prepare_fp32_model,
    run_concurrently,
    summarize,
    summarize_streams,
    wait_for_quiet,
)

# Each prompt opens with its own topic word, so no two prompts share a first token: no
# server gets a prefix-cache hit from an earlier prompt (mlxd's blocks, the peer's trie).
TOPICS = (
    "Astronomy", "Beekeeping", "Cartography", "Dentistry", "Economics", "Falconry", "Geology",
    "Horology", "Irrigation", "Journalism", "Knitting", "Linguistics", "Metallurgy", "Navigation",
    "Oceanography", "Pottery", "Quilting", "Robotics", "Sailing", "Typography", "Upholstery",
    "Viticulture", "Weaving", "Xylography", "Yachting", "Zoology", "Bookbinding", "Calligraphy",
    "Forestry", "Glassblowing", "Origami", "Perfumery", "Archery", "Heraldry", "Ironwork", "Jewellery",
    "Cheesemaking", "Masonry", "Needlepoint", "Orienteering", "Printmaking", "Rowing", "Hydrology", "Tailoring",
    "Embroidery", "Entomology", "Woodturning", "Ceramics",
)
ASPECTS = (
    "the choice of materials", "careful planning", "safety rules", "record keeping", "the right tools",
    "seasonal timing", "quality control", "training apprentices", "local traditions", "the budget",
    "regular maintenance", "written documentation", "regional differences", "correcting mistakes",
    "measurement", "working with clients", "storage", "the history of the craft",
)
SENTENCES = (
    "Practitioners of {topic} often begin by studying {aspect}, because it shapes every later decision.",
    "A common mistake in {topic} is to ignore {aspect} until the very end of a project.",
    "Historians of {topic} note that {aspect} changed a great deal during the last two centuries.",
    "In most schools of {topic}, {aspect} is taught through small exercises repeated many times.",
    "Experienced teachers of {topic} say that {aspect} rewards patience far more than talent.",
    "Some of the oldest records about {topic} describe {aspect} in surprising detail.",
    "Modern equipment has made {aspect} easier, yet the principles of {topic} remain the same.",
    "Beginners in {topic} usually underestimate how much depends on {aspect}.",
    "When a project in {topic} fails, the cause can often be traced back to {aspect}.",
    "Every good manual on {topic} devotes at least one chapter to {aspect}.",
)
# Each contender first serves one request of the measured shape (its own topic, so it
# shares no prefix with them): first-touch costs (allocator growth, page faults, lazy
# imports) then land in no measured N, for mlxd, in-process and peer alike.
WARMUP_MAX_TOKENS = 16
# Pushes every end-of-sequence token out of reach: each request generates max_tokens.
EOS_BIAS = -100.0


def make_prompt(index: int, target_tokens: int, count_tokens: Callable[[str], int]) -> str:
    """A deterministic raw-text prompt of about `target_tokens` tokens that invites a long
    continuation: a handbook chapter on topic `index` that ends mid-thought."""
    topic = TOPICS[index]
    rng = random.Random(f"batching-{index}")
    head = f"{topic}: a practical handbook, chapter {index + 1}\n\n"
    tail = (f"\n\nThe next section explains, step by step and in plain words, how a beginner in "
            f"{topic.lower()} should organise the first year of practice. First,")
    body: list[str] = []
    text = head + tail
    while count_tokens(text) < target_tokens:
        sentence = rng.choice(SENTENCES).format(topic=topic.lower(), aspect=rng.choice(ASPECTS))
        body.append(("\n\n" if body and len(body) % 4 == 0 else " " if body else "") + sentence)
        shorter = text
        text = head + "".join(body) + tail
    # keep whichever of the last two lengths is closer to the target
    if abs(count_tokens(shorter) - target_tokens) < abs(count_tokens(text) - target_tokens):
        text = shorter
    return text


def make_prompt_sets(ns: list[int], target_tokens: int, model_dir: Path,
                     repeats: int = 1) -> tuple[list[dict[int, list[str]]], list[int], str]:
    """Distinct prompts per N and per repeat (the same sets for every contender), their
    token counts, and the warm-up prompt (as long, on a topic of its own)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text).ids)

    needed = repeats * sum(ns) + 1
    if needed > len(TOPICS):
        raise SystemExit(f"--ns and --repeats need {needed} distinct prompts; only {len(TOPICS)} topics exist")
    sets: list[dict[int, list[str]]] = []
    index = 0
    for _ in range(repeats):
        sets.append({})
        for n in ns:
            sets[-1][n] = [make_prompt(index + i, target_tokens, count_tokens) for i in range(n)]
            index += n
    warmup = make_prompt(index, target_tokens, count_tokens)
    prompts = [p for per_repeat in sets for n in ns for p in per_repeat[n]]
    first_tokens = [tokenizer.encode(p).ids[0] for p in [*prompts, warmup]]
    if len(set(first_tokens)) != len(first_tokens):
        raise RuntimeError("two benchmark prompts share their first token; a server could reuse a cache")
    return sets, [count_tokens(p) for p in prompts], warmup


def request_body(server: Server, prompt: str, max_tokens: int, logit_bias: dict[str, float]) -> dict[str, Any]:
    """One greedy raw-text completion; the same body for mlxd and the peer."""
    return {"model": server.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "logit_bias": logit_bias}


@dataclass
class Contender:
    """One system under test, loaded and warmed up, kept alive for the whole run so that
    every N measures all contenders back to back (slow phases of a shared machine then
    hit all of them, not whichever happened to run its N's during one)."""

    name: str
    pids: list[int]  # its process trees: their CPU is its own, not other load
    run: Callable[[list[str]], dict[str, Any]]  # one N: these prompts at once -> summary


def server_contender(server: Server, warmup: str, max_tokens: int, logit_bias: dict[str, float]) -> Contender:
    """An HTTP server, warmed up with one request of the measured shape."""
    run_concurrently(server.base_url, [request_body(server, warmup, WARMUP_MAX_TOKENS, logit_bias)])

    def run(prompts: list[str]) -> dict[str, Any]:
        bodies = [request_body(server, p, max_tokens, logit_bias) for p in prompts]
        return summarize_streams(run_concurrently(server.base_url, bodies))

    return Contender(server.name, [server.process.pid], run)


@contextlib.contextmanager
def in_process_contender(model_dir: Path, warmup: str, max_tokens: int, logit_bias: dict[str, float],
                         stop_ids: list[int], max_num_seqs: int,
                         prefill_chunk_tokens: int) -> Iterator[tuple[Contender, dict[str, Any]]]:
    """BatchGenerator in a child that binds BLIS first, with mlxd's batch limits; yields
    it with the environment the child reports (it warms up before answering)."""
    spec = {
        "model_dir": str(model_dir), "repo": str(REPO), "blas": blas_path(), "max_tokens": max_tokens,
        "logit_bias": logit_bias, "stop_token_ids": stop_ids,
        "completion_batch_size": max_num_seqs, "prefill_batch_size": max_num_seqs,
        "prefill_step_size": prefill_chunk_tokens, "warmup_prompt": warmup,
        "warmup_max_tokens": WARMUP_MAX_TOKENS,
    }
    log("starting in-process BatchGenerator (%s)", spec["blas"])
    child = subprocess.Popen([PYTHON, str(REPO / "bench" / "_inprocess.py")], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert child.stdin is not None and child.stdout is not None

    def ask(payload: dict[str, Any]) -> dict[str, Any]:
        child.stdin.write(json.dumps(payload) + "\n")
        child.stdin.flush()
        line = child.stdout.readline()
        if not line:
            raise RuntimeError(f"in-process child exited with {child.wait()} (its stderr is above)")
        return json.loads(line)

    def run(prompts: list[str]) -> dict[str, Any]:
        batch = ask({"prompts": prompts})
        return summarize(batch["ttft_s"], batch["completion_tokens"], batch["wall_s"], batch["prompt_tokens"],
                         batch["inter_token_s"], batch["stream_decode_tok_s"])

    try:
        env = ask(spec)
        yield Contender("in_process", [child.pid], run), env
    finally:
        child.stdin.close()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def measure_interleaved(contenders: list[Contender], prompt_sets: list[dict[int, list[str]]],
                        quiet_wait_s: float) -> dict[int, dict[str, list[dict[str, Any]]]]:
    """Every repeat, each N on every contender in turn, the order rotating; before each
    run the machine (idle contenders included) must be quiet, and other load is metered."""
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {}
    turn = 0
    for repeat, sets in enumerate(prompt_sets):
        for n, prompts in sets.items():
            first = turn % len(contenders)
            turn += 1
            for contender in contenders[first:] + contenders[:first]:
                wait_for_quiet(quiet_wait_s, mine=())  # also lets every contender settle after the last run
                meter = CpuMeter(contender.pids)
                try:
                    summary = {**contender.run(prompts), "other_cpu_cores": meter.other_cores()}
                except Exception as exc:  # keep the other figures; say what failed
                    log("%s N=%d failed: %s", contender.name, n, exc)
                    summary = {"error": f"{type(exc).__name__}: {exc}"}
                else:
                    log("%s N=%d (repeat %d): %s", contender.name, n, repeat + 1, _brief(summary))
                runs.setdefault(n, {}).setdefault(contender.name, []).append(summary)
    return runs


BATCHING_REPEAT_KEYS = ("aggregate_tok_s", "ttft_p50_s", "stream_decode_tok_s_mean", "error")


def _brief(summary: dict[str, Any]) -> str:
    return (f"{summary['aggregate_tok_s']} tok/s, ttft p50 {summary['ttft_p50_s']} s, "
            f"mean {summary['mean_completion_tokens']} tokens, wall {summary['wall_s']} s, "
            f"other load {summary.get('other_cpu_cores')} cores")


def _mlxd_worker_dtype(log_path: Path) -> str | None:
    """The worker says which dtype it serves in its load line; /health does not carry it."""
    match = re.search(r"loaded .*?: (\w+) on \w+, BLAS", log_path.read_text(errors="replace"))
    return match.group(1) if match else None


def _ratio(numerator: Any, denominator: Any) -> float | None:
    if not isinstance(numerator, (int, float)) or not isinstance(denominator, (int, float)) or not denominator:
        return None
    return round(numerator / denominator, 3)


def _figure(results: dict[int, dict[str, dict[str, Any]]], n: int, system: str, key: str) -> Any:
    return results.get(n, {}).get(system, {}).get(key)


def headline(results: dict[int, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The ratios the issue's targets are stated in, and whether each is met."""
    agg = "aggregate_tok_s"
    figures = {
        "speedup_n8_vs_n1": _ratio(_figure(results, 8, "mlxd", agg), _figure(results, 1, "mlxd", agg)),
        "ratio_n8_vs_in_process": _ratio(_figure(results, 8, "mlxd", agg), _figure(results, 8, "in_process", agg)),
        "ratio_n8_vs_peer": _ratio(_figure(results, 8, "mlxd", agg), _figure(results, 8, "peer", agg)),
        "ttft_p50_ratio_n2_vs_n1": _ratio(_figure(results, 2, "mlxd", "ttft_p50_s"),
                                          _figure(results, 1, "mlxd", "ttft_p50_s")),
    }
    goals = {"speedup_n8_vs_n1": (">=", 3.0), "ratio_n8_vs_in_process": (">=", 0.9),
             "ratio_n8_vs_peer": (">=", 1.0), "ttft_p50_ratio_n2_vs_n1": ("<=", 2.5)}
    targets = {}
    for key, (op, goal) in goals.items():
        value = figures[key]
        met = None if value is None else (value >= goal if op == ">=" else value <= goal)
        targets[key] = {"target": f"{op} {goal}", "value": value, "met": met}
    return {**figures, "targets": targets}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ns", default="1,2,4,8", help="concurrent client counts, comma-separated (default 1,2,4,8)")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens each request generates (default 128)")
    parser.add_argument("--prompt-tokens", type=int, default=300, help="approximate prompt length (default 300)")
    parser.add_argument("--max-num-seqs", type=int, default=8,
                        help="batch limit for all three contenders (mlxd --max-num-seqs, peer "
                             "--decode/--prompt-concurrency, BatchGenerator batch sizes; default 8)")
    parser.add_argument("--prefill-chunk-tokens", type=int, default=512,
                        help="prefill step for all three (mlxd's default, 512)")
    parser.add_argument("--quiet-wait-s", type=float, default=30.0,
                        help="before each measurement, wait up to this long for other processes "
                             "to leave the CPUs idle (default 30; the load seen is reported)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="measure every N this many times, on fresh prompts, and report medians (default 3)")
    parser.add_argument("--skip-peer", action="store_true", help="do not run mlx_lm.server")
    parser.add_argument("--out", type=Path, help="also write the JSON to this file")
    args = parser.parse_args(argv)
    ns = [int(n) for n in args.ns.split(",") if n.strip()]
    if not ns or min(ns) < 1 or len(set(ns)) != len(ns):
        parser.error(f"--ns must list distinct positive counts, got {args.ns!r}")
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")

    started = time.perf_counter()
    env = environment()
    model_dir = prepare_fp32_model()
    prompt_sets, prompt_lengths, warmup = make_prompt_sets(ns, args.prompt_tokens, model_dir, args.repeats)
    stop_ids = eos_token_ids(model_dir)
    logit_bias = {str(t): EOS_BIAS for t in stop_ids}
    log("model %s; %d prompts of %d-%d tokens; EOS ids %s biased by %s", model_dir, len(prompt_lengths),
        min(prompt_lengths), max(prompt_lengths), stop_ids, EOS_BIAS)

    errors: dict[str, str] = {}
    contenders: list[Contender] = []
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(mlxd_server(model_dir, max_num_seqs=args.max_num_seqs,
                                                     prefill_chunk_tokens=args.prefill_chunk_tokens))
            contenders.append(server_contender(server, warmup, args.max_tokens, logit_bias))
            env["mlxd_worker"] = {**server.info, "dtype": _mlxd_worker_dtype(server.log_path),
                                  "log": str(server.log_path)}
        except Exception as exc:  # report what the others measure anyway
            log("mlxd failed: %s", exc)
            errors["mlxd"] = str(exc)
        try:
            contender, env["in_process"] = stack.enter_context(in_process_contender(
                model_dir, warmup, args.max_tokens, logit_bias, stop_ids, args.max_num_seqs,
                args.prefill_chunk_tokens))
            contenders.append(contender)
        except Exception as exc:
            log("in-process failed: %s", exc)
            errors["in_process"] = str(exc)
        if not args.skip_peer:
            try:
                server = stack.enter_context(peer_server(model_dir, max_num_seqs=args.max_num_seqs,
                                                         prefill_chunk_tokens=args.prefill_chunk_tokens))
                contenders.append(server_contender(server, warmup, args.max_tokens, logit_bias))
                env["peer"] = {**server.info, "log": str(server.log_path)}
            except Exception as exc:
                log("peer failed: %s", exc)
                errors["peer"] = str(exc)
        runs = measure_interleaved(contenders, prompt_sets, args.quiet_wait_s)
    results = {n: {name: median_of_runs(per_name, BATCHING_REPEAT_KEYS) for name, per_name in per_n.items()} for n, per_n in runs.items()}
    for n, per_n in runs.items():
        for name, per_name in per_n.items():
            for repeat, run in enumerate(per_name):
                if "error" in run:
                    errors[f"{name} N={n} repeat {repeat + 1}"] = run["error"]
    full_length = all(run.get("min_completion_tokens") == args.max_tokens
                      for per_n in results.values() for run in per_n.values() if "error" not in run)
    if not full_length:
        log("warning: some requests stopped before %d tokens (see min_completion_tokens)", args.max_tokens)
    env["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    report = {
        "benchmark": "batching",
        **headline(results),
        "all_requests_generated_max_tokens": full_length,
        "config": {
            "ns": ns, "repeats": args.repeats, "max_tokens": args.max_tokens, "prompt_tokens_target": args.prompt_tokens,
            "prompt_tokens": {"min": min(prompt_lengths), "max": max(prompt_lengths),
                              "mean": round(sum(prompt_lengths) / len(prompt_lengths), 1)},
            "max_num_seqs": args.max_num_seqs, "prefill_chunk_tokens": args.prefill_chunk_tokens,
            "endpoint": "/v1/completions (streaming, greedy)", "eos_logit_bias": logit_bias,
            "model_dir": str(model_dir),
        },
        "environment": env,
        "results": {str(n): per_n for n, per_n in results.items()},
        "errors": errors,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    emit(report, args.out)
    return 1 if "mlxd" in errors else 0


if __name__ == "__main__":
    sys.exit(main())
