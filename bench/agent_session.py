"""A yardstick for agents: one Claude-Code-shaped session replayed on mlxd and llama.cpp.

A coding agent's session, deterministic from `--seed` (bench/_agent_transcript.py): a
~1.2K-token system prompt and a task, then 19 more turns, each adding the previous reply
(as an assistant message carrying a tool call) and that call's ~950-token result (file
contents, test runs, grep hits, git logs, listings). Every turn asks `--max-tokens` 120 at
temperature 0 through /v1/chat/completions, streaming; the body is the same for every
contender but for `model` (and llama.cpp's `cache_prompt`), and each contender's own replies
go into its next turns, as an agent's would. Contenders, all up at once and taking turns
(the order rotates every turn; each turn waits for a quiet machine): mlxd (`--dtype auto`,
its prefix cache at its defaults), llama.cpp's `llama-server` on the same GGUF and thread
count with its prompt cache on (one slot holding the whole session, `cache_prompt`,
`--cache-ram`), and mlxd once more with the whole service stopped after turn
`--restart-after` and started again on the same home, so only the SSD cold tier can make
the next turn warm. TTFT is the client's: request sent to first streamed content.
One JSON object on stdout (per-turn figures, each contender's setup, the ratios); progress
on stderr. `--help` lists the flags.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from _agent_transcript import SYSTEM_TOKENS, TOOL_RESULT_TOKENS, SessionScript, build_session, messages_for_turn
from common import (
    CpuMeter,
    Server,
    StreamResult,
    emit,
    environment,
    llamacpp_server,
    log,
    mlxd_server,
    percentile,
    run_concurrently,
    stop_gracefully,
    stream_request,
    tree_cpu_seconds,
    wait_for_quiet,
)
from engine import HOME, THREADS, _mlxd_setup, ensure_llama_server, gguf_summary, llamacpp_build_info, llamacpp_setup

MODEL = "qwen2.5-coder-0.5b"  # catalog name (models/catalog.py); its GGUF is Q4_K_M
TARGET_WARM_RATIO = 0.5  # mlxd's warm TTFT p50 over llama.cpp's, at most
TARGET_RESTART_RATIO = 2.0  # TTFT of the turn after the restart over the warm median before it, at most
# llama.cpp, as a careful user would run it for one agent: a single slot, so every turn lands on
# the slot that holds the session, with the model's whole window (32K: the session fits);
# --jinja renders the GGUF's own chat template (assistant tool_calls and tool messages);
# --cache-ram keeps evicted prompts in RAM (its default, said explicitly);
# --cache-reuse lets it reuse chunks of a prompt that moved (KV shifting), beyond the prefix.
LLAMACPP_CTX = 32768
LLAMACPP_ARGS = ["--jinja", "--cache-ram", "8192", "--cache-reuse", "256"]
WARMUP_BODY = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0}


@dataclass
class SessionContender:
    """One server and the session it is playing: its replies so far and each turn's figures."""

    name: str
    start: Callable[[], AbstractContextManager[Server]]  # starts the server; leaving the context stops it
    extra_body: dict[str, Any] = field(default_factory=dict)
    server: Server | None = None
    replies: list[str] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    setup: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def run_turn(contender: SessionContender, script: SessionScript, turn: int, max_tokens: int) -> dict[str, Any]:
    """Send turn `turn` of the session, streamed; the figures the JSON keeps for it."""
    server = contender.server
    assert server is not None
    body = {"model": server.model, "messages": messages_for_turn(script, turn, contender.replies),
            "max_tokens": max_tokens, "temperature": 0, **contender.extra_body}
    meter = CpuMeter([server.process.pid])
    cpu = [tree_cpu_seconds(server.process.pid)]
    result = asyncio.run(_stream(server.base_url, body, lambda: cpu.append(tree_cpu_seconds(server.process.pid))))
    cpu.append(tree_cpu_seconds(server.process.pid))
    record: dict[str, Any] = {
        "turn": turn,
        "ttft_s": round(result.ttft_s, 3) if result.ttft_s is not None else None,
        "request_s": round(result.last_token_at - result.sent_at, 3),
        # CPU seconds the server's processes used until the first token, and in all
        "server_cpu_to_first_token_s": round(cpu[1] - cpu[0], 3) if len(cpu) == 3 else None,
        "server_cpu_s": round(cpu[-1] - cpu[0], 3),
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "finish_reason": result.finish_reason,
        "other_cores": meter.other_cores(),
    }
    if result.timings:  # llama.cpp: cache_n prompt tokens reused, prompt_n computed
        cache_n, prompt_n = result.timings.get("cache_n"), result.timings.get("prompt_n")
        record["cached_tokens"] = cache_n
        record["server"] = {k: result.timings.get(k) for k in ("cache_n", "prompt_n", "prompt_ms", "predicted_n",
                                                                "predicted_ms")}
        if isinstance(cache_n, int) and isinstance(prompt_n, int):
            record["prompt_tokens"] = cache_n + prompt_n
    else:  # mlxd: usage.prompt_tokens_details.cached_tokens, and its mlxd.cache / mlxd.timings blocks
        details = result.usage.get("prompt_tokens_details") or {}
        record["cached_tokens"] = details.get("cached_tokens")
        timings = result.extension.get("timings") or {}
        record["server"] = {**{k: timings.get(k) for k in ("queue_s", "prefill_s", "ttft_s", "cold_fetch_s")},
                            **{k: (result.extension.get("cache") or {}).get(k)
                               for k in ("cached_tokens", "cold_tokens", "cold_bytes")}}
    if isinstance(record["cached_tokens"], int) and record["prompt_tokens"]:
        record["cached_fraction"] = round(record["cached_tokens"] / record["prompt_tokens"], 4)
        record["computed_tokens"] = record["prompt_tokens"] - record["cached_tokens"]
    contender.replies.append(result.text)
    return record


async def _stream(base_url: str, body: dict[str, Any], on_first_content: Callable[[], None]) -> StreamResult:
    async with httpx.AsyncClient(timeout=httpx.Timeout(3600.0)) as client:
        return await stream_request(client, base_url, body, "/v1/chat/completions", on_first_content)


def restart_service(contender: SessionContender, stack: contextlib.ExitStack) -> dict[str, Any]:
    """Stop the whole service (SIGTERM to the router: it drains, the worker flushes its SSD
    writes, the kvstore syncs) and start it again on the same home, with no warm-up."""
    assert contender.server is not None
    started = time.perf_counter()
    graceful = stop_gracefully(contender.server)
    stack.close()  # what stop_gracefully left (nothing, if it was graceful)
    stopped = time.perf_counter()
    contender.server = stack.enter_context(contender.start())
    return {"stopped_gracefully": graceful, "stop_s": round(stopped - started, 2),
            "start_s": round(time.perf_counter() - stopped, 2)}


def summarize(contender: SessionContender, restart_after: int | None) -> dict[str, Any]:
    """TTFT first / warm (turns after the first) p50 and p95, cached fractions, wall time;
    for the restart run also the turns before and after the restart."""
    turns = [t for t in contender.turns if t.get("ttft_s") is not None]
    warm = [t["ttft_s"] for t in turns if t["turn"] > 1]
    summary: dict[str, Any] = {
        "num_turns": len(turns),
        "first_turn_ttft_s": next((t["ttft_s"] for t in turns if t["turn"] == 1), None),
        "warm_ttft_p50_s": _round(percentile(warm, 50)),
        "warm_ttft_p95_s": _round(percentile(warm, 95)),
        "warm_server_cpu_to_first_token_p50_s": _round(percentile(
            [t["server_cpu_to_first_token_s"] for t in turns
             if t["turn"] > 1 and t.get("server_cpu_to_first_token_s") is not None], 50)),
        "warm_cached_fraction_p50": _round(percentile([t["cached_fraction"] for t in turns
                                                       if t["turn"] > 1 and "cached_fraction" in t], 50), 4),
        "cached_fraction_per_request": [t.get("cached_fraction") for t in turns],
        "computed_tokens_per_request": [t.get("computed_tokens") for t in turns],
        "final_prompt_tokens": turns[-1]["prompt_tokens"] if turns else None,
        "session_wall_s": round(sum(t["request_s"] for t in turns), 2),
    }
    if restart_after is not None:
        before = [t["ttft_s"] for t in turns if 1 < t["turn"] <= restart_after]
        after = next((t for t in turns if t["turn"] == restart_after + 1), None)
        median_before = percentile(before, 50)
        summary.update({
            "warm_ttft_median_before_restart_s": _round(median_before),
            "after_restart_ttft_s": after["ttft_s"] if after else None,
            "after_restart_cached_fraction": after.get("cached_fraction") if after else None,
            "after_restart_server": after.get("server") if after else None,
            "warm_ttft_p50_after_restart_turns_s": _round(percentile(
                [t["ttft_s"] for t in turns if t["turn"] > restart_after + 1], 50)),
            "after_restart_ttft_ratio": _round(after["ttft_s"] / median_before) if after and median_before else None,
        })
    if contender.error:
        summary["error"] = contender.error
    return summary


def make_report(args: argparse.Namespace, contenders: list[SessionContender], restarts: dict[str, Any],
                env: dict[str, Any], setting: dict[str, Any], started: float, complete: bool) -> dict[str, Any]:
    """The JSON: the ratios and targets first, then each contender's summary, the
    configuration, the restart, every turn's figures and the environment."""
    summaries = {c.name: summarize(c, args.restart_after if c.name == "mlxd_restart" else None)
                 for c in contenders}
    mine, theirs = summaries.get("mlxd", {}), summaries.get("llamacpp", {})
    warm_ratio = (_round(mine["warm_ttft_p50_s"] / theirs["warm_ttft_p50_s"])
                  if mine.get("warm_ttft_p50_s") and theirs.get("warm_ttft_p50_s") else None)
    restart_ratio = summaries.get("mlxd_restart", {}).get("after_restart_ttft_ratio")
    cpu_key = "warm_server_cpu_to_first_token_p50_s"
    cpu_ratio = (_round(mine[cpu_key] / theirs[cpu_key]) if mine.get(cpu_key) and theirs.get(cpu_key) else None)
    env = {**env, "loadavg_1m_at_end": round(os.getloadavg()[0], 2)}
    return {
        "benchmark": "agent_session",
        "complete": complete,
        "warm_ttft_p50_ratio_vs_llamacpp": warm_ratio,
        "after_restart_ttft_ratio": restart_ratio,
        # the same ratio in CPU seconds the servers spent until the first token: on a shared
        # machine, less skewed by other load than the wall-clock TTFT (spinning threads count)
        "warm_server_cpu_to_first_token_p50_ratio_vs_llamacpp": cpu_ratio,
        "targets": {"warm_ttft_p50_ratio_max": TARGET_WARM_RATIO,
                    "warm_met": warm_ratio is not None and warm_ratio <= TARGET_WARM_RATIO,
                    "after_restart_ratio_max": TARGET_RESTART_RATIO,
                    "after_restart_met": restart_ratio is not None and restart_ratio <= TARGET_RESTART_RATIO},
        "summary": summaries,
        "config": {
            **setting, "seed": args.seed,
            "turns": args.turns, "max_tokens": args.max_tokens, "temperature": 0,
            "restart_after_turn": args.restart_after or None, "threads": THREADS,
            "endpoint": "/v1/chat/completions, streamed (stream_options.include_usage)",
            "ttft": "client clock: request sent to the first streamed content",
            "warm_turns": "turns after the first",
            "cached_fraction": "mlxd: usage.prompt_tokens_details.cached_tokens / prompt_tokens; llama.cpp: "
                               "timings.cache_n / (cache_n + prompt_n)",
            "session_wall_s": "sum of the contender's request times (send to last token), no waits",
            "order": "contenders take turns, the order rotating every turn; a turn waits up to "
                     f"{args.quiet_wait_s:.0f} s for an idle machine (other_cores: load beside it)",
        },
        "restart": restarts or None,
        "contenders": {c.name: {"setup": c.setup, "turns": c.turns, "error": c.error} for c in contenders},
        "environment": env,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=MODEL, help=f"catalog name (default {MODEL})")
    parser.add_argument("--seed", type=int, default=0, help="which session (default 0)")
    parser.add_argument("--turns", type=int, default=20, help="turns in the session (default 20)")
    parser.add_argument("--max-tokens", type=int, default=120, help="tokens asked per turn (default 120)")
    parser.add_argument("--system-tokens", type=int, default=SYSTEM_TOKENS,
                        help=f"system prompt size (default {SYSTEM_TOKENS})")
    parser.add_argument("--tool-result-tokens", type=int, default=TOOL_RESULT_TOKENS,
                        help=f"size of each tool result (default {TOOL_RESULT_TOKENS})")
    parser.add_argument("--restart-after", type=int, default=10,
                        help="turn after which the restart run stops and starts mlxd (default 10; 0: no restart run)")
    parser.add_argument("--quiet-wait-s", type=float, default=15.0,
                        help="before each turn, wait up to this long for an idle machine (default 15)")
    parser.add_argument("--skip-llamacpp", action="store_true", help="do not build or run llama-server")
    parser.add_argument("--out", type=Path, help="also write the JSON to this file")
    args = parser.parse_args(argv)
    if not 0 <= args.restart_after < args.turns:
        parser.error(f"--restart-after must be in [0, {args.turns - 1}]")

    # a SIGTERM (timeout, CI) unwinds like Ctrl-C: every server started is stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    from models.catalog import find_model
    from models.provision import provision_model
    from tokenizers import Tokenizer

    started = time.perf_counter()
    env = environment()
    llama_build = None
    if not args.skip_llamacpp:
        llama_build = llamacpp_build_info(ensure_llama_server())
    env["llamacpp_build"] = llama_build
    catalog_model = find_model(args.model)
    model_dir = provision_model(HOME, catalog_model)
    gguf = HOME / "downloads" / catalog_model.gguf_file
    gguf_info = gguf_summary(gguf)
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    script = build_session(args.seed, lambda text: len(tokenizer.encode(text).ids), num_turns=args.turns,
                           system_tokens=args.system_tokens, tool_result_tokens=args.tool_result_tokens)
    log("session: system %d tokens, tool results %s tokens", len(tokenizer.encode(script.system).ids),
        [len(tokenizer.encode(t.result).ids) for t in script.tool_turns])

    setting = {"model": args.model, "gguf": gguf_info, "model_dir": str(model_dir), "session_tokens": {
        "system": len(tokenizer.encode(script.system).ids), "task": len(tokenizer.encode(script.task).ids),
        "tool_results": [len(tokenizer.encode(t.result).ids) for t in script.tool_turns],
        "tools": [t.name for t in script.tool_turns]}}
    partial = args.out.with_suffix(".partial.json") if args.out else None
    restart_home = Path(tempfile.mkdtemp(prefix="mlxd-agent-session-"))
    contenders = [SessionContender("mlxd", lambda: mlxd_server(model_dir, name="mlxd"))]
    if llama_build is not None:
        contenders.append(SessionContender(
            "llamacpp", lambda: llamacpp_server(Path(llama_build["binary"]), gguf, threads=THREADS, parallel=1,
                                                ctx_size=LLAMACPP_CTX, extra_args=LLAMACPP_ARGS),
            extra_body={"cache_prompt": True}))
    if args.restart_after:
        contenders.append(SessionContender(
            "mlxd_restart", lambda: mlxd_server(model_dir, home=restart_home, name="mlxd_restart")))
    restarts: dict[str, Any] = {}
    try:
        with contextlib.ExitStack() as outer:
            stacks = {}
            for contender in contenders:
                stacks[contender.name] = outer.enter_context(contextlib.ExitStack())
                contender.server = stacks[contender.name].enter_context(contender.start())
                if contender.name == "llamacpp":
                    contender.setup = llamacpp_setup(
                        contender.server, gguf, gguf_info, llama_build,
                        f"cache_prompt true in every request; {' '.join(LLAMACPP_ARGS)}; --parallel 1 "
                        f"(one slot holds the session); --ctx-size {LLAMACPP_CTX}")
                else:
                    contender.setup = {**_mlxd_setup(contender.server, "auto", model_dir),
                                       "cache": "prefix cache at its defaults (256-token blocks, hot tier in "
                                                "RAM, cold tier on SSD under the home); "
                                                + ("home kept across the restart" if contender.name == "mlxd_restart"
                                                   else "throwaway home")}
                run_concurrently(contender.server.base_url, [{**WARMUP_BODY, "model": contender.server.model}],
                                 path="/v1/chat/completions")
            for turn in range(1, args.turns + 1):
                shift = turn % len(contenders)
                for contender in contenders[shift:] + contenders[:shift]:
                    if contender.error:
                        continue
                    wait_for_quiet(args.quiet_wait_s, mine=())
                    try:
                        record = run_turn(contender, script, turn, args.max_tokens)
                    except Exception as exc:  # the others play on; the JSON says where it stopped
                        contender.error = f"turn {turn}: {type(exc).__name__}: {exc}"
                        log("%s failed: %s", contender.name, contender.error)
                        continue
                    contender.turns.append(record)
                    log("%s turn %d: ttft %.2f s, %s/%s prompt tokens cached, %s generated", contender.name, turn,
                        record["ttft_s"] or -1, record.get("cached_tokens"), record["prompt_tokens"],
                        record["completion_tokens"])
                    if contender.name == "mlxd_restart" and turn == args.restart_after:
                        log("restarting mlxd_restart on %s", restart_home)
                        restarts = restart_service(contender, stacks[contender.name])
                        log("restarted: %s", restarts)
                    if partial is not None:  # a long run on a shared machine: what it has so far
                        partial.parent.mkdir(parents=True, exist_ok=True)
                        report = make_report(args, contenders, restarts, env, setting, started, complete=False)
                        partial.write_text(json.dumps(report, indent=2) + "\n")
    finally:
        shutil.rmtree(restart_home, ignore_errors=True)

    report = make_report(args, contenders, restarts, env, setting, started, complete=True)
    emit(report, args.out)
    if partial is not None:
        partial.unlink(missing_ok=True)
    return 1 if any(c.error for c in contenders) else 0


if __name__ == "__main__":
    sys.exit(main())
