"""Tool calls on a fixed set of turns, side by side: mlxd with its lazy call grammar
(`tool_choice: auto` calls held to the tools once begun; the default) against mlxd with it
switched off, and llama.cpp's `llama-server` with its own tool-call support on the same GGUF.
`--arms layout` instead compares the two prompt layouts (`stable_first` against the chat
template's own), the question this bench was first built for.

The fixed set `bench/tool_calls_set.json` holds 100+ tool-calling turns in groups, one per
tool set of a captured client (Claude Code, OpenCode, Codex, openai-python, anthropic-python:
the real schemas of tests/clients/, with short real descriptions where the capture has
placeholders): single tools and many, enums, nested objects, turns after a tool result, and
turns whose right answer is text. mlxd's arms are profiles of one loaded model
(`MODEL:free` sets `tool_call_grammar = false`); every turn is sent to every arm (greedy,
/v1/chat/completions, tool_choice auto), group by group, one arm's turns at a time
(`--concurrency` in flight), so each arm's decode speed is its own and not its neighbours'.

Per model and arm: the valid-call rate (of the answers that attempt a call: every call
parses, names an offered tool, and its arguments validate against that tool's JSON schema;
call markup the server returned as text counts as an invalid attempt), the right-tool rate
(over all turns: the first call names the expected tool, or there is no call when none is
expected), the text-answer rate after a tool result, calls mlxd recovered from text (its
`mlxd.tool_calls` block), repeated calls, and decode tok/s (completion tokens over mlxd's
own decode time, or llama.cpp's `timings`; and, for mlxd's arms, again on a second pass
whose prompts are all cached and whose answers all run to `--decode-tokens`,
`decode_phase`: the ratio of the two arms is taken there).
Prints one JSON object on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import jsonschema

from common import REPO, CpuMeter, emit, environment, eos_token_ids, llamacpp_server, log, mlxd_server
from engine import ensure_llama_server, llamacpp_build_info
from step_split import engine_counters, step_split

HOME = Path(os.environ.get("MLXD_TEST_HOME", REPO / ".cache" / "test-home"))  # the tests' provisioned models
SET_PATH = Path(__file__).resolve().parent / "tool_calls_set.json"
MODELS = ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")  # catalog names (models/catalog.py)
CHAT = "/v1/chat/completions"
# mlxd's arms: each a profile of the one loaded model ("" : the model's own settings)
ARM_SETS = {
    "grammar": {"constrained": "", "free": "tool_call_grammar = false"},
    "layout": {"stable_first": "", "template": 'prompt_layout = "template"'},
}
COUNTER_SETTLE_S = 4.5  # a pong taken after the round (heartbeat 2 s; 2.5 s missed some here)
THREADS = 2  # llama.cpp's, as mlxd's worker uses the machine's cores
# call markup the server returned as text (it could not parse it as a call of an offered tool)
_MARKUP = re.compile(r'<tool_call>|^\s*(```(json)?\s*)?\{\s*"name"\s*:')


def load_set(path: Path) -> list[dict[str, Any]]:
    """The groups of the data set, each checked: every expected tool is one of its tools."""
    groups = json.loads(path.read_text())["groups"]
    for group in groups:
        names = {tool["function"]["name"] for tool in group["tools"]}
        for turn in group["turns"]:
            if turn["expected"] is not None and turn["expected"] not in names:
                raise ValueError(f"{turn['id']}: expected tool {turn['expected']!r} is not in its group's tools")
    return groups


def ask(client: httpx.Client, model: str, group: dict[str, Any], turn: dict[str, Any], max_tokens: int,
        **extra: Any) -> dict[str, Any]:
    """One turn, answered greedily; the answer as the OpenAI API gives it, timed."""
    body = {"model": model, "temperature": 0, "max_tokens": max_tokens, "tools": group["tools"],
            "messages": [{"role": "system", "content": group["system"]}, *turn["messages"]], **extra}
    started = time.perf_counter()
    response = client.post(CHAT, json=body)
    if response.status_code != 200:
        raise RuntimeError(f"{turn['id']}: {response.status_code} {response.text[:300]}")
    answer = response.json()
    answer["elapsed_s"] = time.perf_counter() - started
    return answer


def score(group: dict[str, Any], turn: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """What one answer did: its calls, whether it attempted one, whether every call is valid,
    whether it chose right, what mlxd says it did with them, and its decode time."""
    choice = answer["choices"][0]
    message = choice["message"]
    calls = message.get("tool_calls") or []
    content = message.get("content") or ""
    schemas = {tool["function"]["name"]: tool["function"].get("parameters") or {} for tool in group["tools"]}
    problems = [problem for call in calls if (problem := call_problem(call, schemas)) is not None]
    unparsed = bool(_MARKUP.search(content))  # markup the server could not make a call of
    attempted = bool(calls) or unparsed
    first = calls[0]["function"]["name"] if calls else None
    expected = turn["expected"]
    right = (first == expected and not unparsed) if expected is not None else not attempted
    usage = answer.get("usage") or {}
    extension = answer.get("mlxd") or {}
    reported = extension.get("tool_calls") or {}
    decode_s = (extension.get("timings") or {}).get("decode_s")
    if decode_s is None and answer.get("timings"):  # llama.cpp's: predicted_ms over predicted_n
        decode_s = answer["timings"].get("predicted_ms", 0.0) / 1000.0
    return {
        "id": turn["id"], "expected": expected, "called": [call["function"]["name"] for call in calls],
        "attempted": attempted, "valid": attempted and not unparsed and not problems, "right": right,
        "problems": problems + (["call markup returned as text"] if unparsed else []),
        "after_tool_result": any(m["role"] == "tool" for m in turn["messages"]),
        "recovered": int(reported.get("recovered_from_text") or 0), "repeated": len(reported.get("repeated") or []),
        "finish_reason": choice.get("finish_reason"), "content": content[:120],
        "prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
        "completion_tokens": usage.get("completion_tokens"), "decode_s": decode_s,
        "elapsed_s": round(answer["elapsed_s"], 2),
    }


def call_problem(call: dict[str, Any], schemas: dict[str, dict[str, Any]]) -> str | None:
    """Why a returned call is not valid (None: it is): unknown name, arguments that are not a
    JSON object, or arguments its tool's schema refuses."""
    name = call["function"]["name"]
    if name not in schemas:
        return f"{name}: not an offered tool"
    try:
        arguments = json.loads(call["function"]["arguments"])
    except ValueError as exc:
        return f"{name}: arguments are not JSON ({exc})"
    if not isinstance(arguments, dict):
        return f"{name}: arguments are not an object"
    schema = schemas[name]
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.path))
    return f"{name}: {errors[0].message}" if errors else None


def run_groups(base_url: str, arms: dict[str, str], groups: list[dict[str, Any]], concurrency: int,
               max_tokens: int) -> dict[str, list[dict[str, Any]]]:
    """Every turn under every arm (`arms`: arm -> the model name that selects it), group by
    group and one arm after another inside a group, so that an arm's decode speed is its
    own: each group's first turn first (its tools and system text are then cached), the
    rest `concurrency` at a time."""
    scored: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    with httpx.Client(base_url=base_url, timeout=httpx.Timeout(3600.0)) as client, \
            ThreadPoolExecutor(concurrency) as pool:
        for group in groups:
            first, *rest = group["turns"]
            for arm, model in arms.items():
                answers = [ask(client, model, group, first, max_tokens)]
                answers += list(pool.map(lambda turn: ask(client, model, group, turn, max_tokens), rest))
                mine = [score(group, turn, answer) for turn, answer in zip(group["turns"], answers)]
                scored[arm] += mine
                log("%s %s: %d/%d right, %d valid of %d attempts", arm, group["name"], sum(s["right"] for s in mine),
                    len(mine), sum(s["valid"] for s in mine), sum(s["attempted"] for s in mine))
    return scored


def decode_phase(base_url: str, arms: dict[str, str], groups: list[dict[str, Any]], concurrency: int,
                 max_tokens: int, eos_ids: list[int], repeats: int = 1,
                 worker_model: str | None = None) -> dict[str, dict[str, Any]]:
    """Each arm's decode speed on its own, with every answer the same length: every
    group's turns again, arm after arm inside a group, all of a group's turns at once,
    their prompts all cached, EOS pushed out of reach (logit_bias -100) so that each
    answer runs to `max_tokens` (a call that closes is followed by more text or calls:
    the grammar lets the answer go on where the request allows parallel calls).

    The first pass cannot tell it: there every answer's decode time includes the prefill
    chunks of the turns beside it, and the arms' answers differ in length (the grammar
    writes arguments compact), so the batch empties at a different pace in each arm and
    a longer answer's last tokens decode in a smaller, faster batch. Completion tokens
    (after the first) over the worker's decode time (`mlxd.timings.decode_s`), summed
    over `repeats` passes; which arm goes first alternates from group to group and pass
    to pass, so neither arm always meets the machine's slower moments (its speed drifts
    by 10-15% within a minute here).

    Because that drift is as large as what is measured, each (group, pass) pair's own
    ratio is kept too, and with `worker_model` each arm's steps are split from the
    worker's counters read around every round (bench/step_split.py): the grammar's own
    share of a step shows apart from the machine's noise."""
    bias = {str(t): -100.0 for t in eos_ids}
    tokens = dict.fromkeys(arms, 0)
    seconds = dict.fromkeys(arms, 0.0)
    shortest: dict[str, int] = {}
    pairs: dict[tuple[int, int], dict[str, float]] = {}
    counted: dict[str, dict[str, float]] = {arm: {} for arm in arms}
    walls = dict.fromkeys(arms, 0.0)
    with httpx.Client(base_url=base_url, timeout=httpx.Timeout(3600.0)) as client, \
            ThreadPoolExecutor(concurrency) as pool:
        rounds = [(r, g, arm) for r in range(repeats) for g in range(len(groups))
                  for arm in (list(arms) if (g + r) % 2 == 0 else list(arms)[::-1])]
        before = engine_counters(base_url, worker_model, COUNTER_SETTLE_S) if worker_model else {}
        for r, g, arm in rounds:
            model, group = arms[arm], groups[g]
            round_tokens, round_s = 0, 0.0
            started = time.perf_counter()
            for answer in pool.map(lambda turn: ask(client, model, group, turn, max_tokens, logit_bias=bias),
                                   group["turns"]):
                decode_s = (answer.get("mlxd") or {}).get("timings", {}).get("decode_s") or 0.0
                used = (answer.get("usage") or {}).get("completion_tokens") or 0
                shortest[arm] = min(shortest.get(arm, used), used)
                if decode_s and used > 1:
                    round_tokens += used - 1
                    round_s += decode_s
            walls[arm] += time.perf_counter() - started
            tokens[arm] += round_tokens
            seconds[arm] += round_s
            if round_s:
                pairs.setdefault((r, g), {})[arm] = round_tokens / round_s
            if worker_model:
                after = engine_counters(base_url, worker_model, COUNTER_SETTLE_S)
                for name, value in after.items():
                    counted[arm][name] = counted[arm].get(name, 0.0) + value - before.get(name, 0.0)
                before = after
    first, second = list(arms)[:2]
    paired = sorted(p[first] / p[second] for p in pairs.values() if first in p and second in p)
    figures = {arm: {"tok_s": round(tokens[arm] / seconds[arm], 2) if seconds[arm] else None,
                     "min_completion_tokens": shortest.get(arm)} for arm in arms}
    for arm in arms:
        if worker_model:
            figures[arm]["step_split"] = step_split({}, counted[arm], walls[arm])
    figures[first]["paired_ratios_vs_" + second] = {
        "each": [round(x, 3) for x in paired],
        "median": round(paired[len(paired) // 2] if len(paired) % 2 else
                        (paired[len(paired) // 2 - 1] + paired[len(paired) // 2]) / 2, 3) if paired else None}
    return figures


def rates(scored: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of one model under one arm."""
    attempts = [s for s in scored if s["attempted"]]
    expect_call = [s for s in scored if s["expected"] is not None]
    expect_none = [s for s in scored if s["expected"] is None]
    after_result = [s for s in scored if s["after_tool_result"]]
    prompt = sum(s["prompt_tokens"] or 0 for s in scored)
    decoded = [s for s in scored if s["decode_s"] and (s["completion_tokens"] or 0) > 1]
    decode_s = sum(s["decode_s"] for s in decoded)

    def percent(part: int, whole: int) -> float | None:
        return round(100.0 * part / whole, 1) if whole else None

    return {
        "valid_call_rate": percent(sum(s["valid"] for s in attempts), len(attempts)),
        "valid_call_rate_of_expected": percent(sum(s["valid"] for s in expect_call), len(expect_call)),
        "right_tool_rate": percent(sum(s["right"] for s in scored), len(scored)),
        "right_tool_rate_expected_call": percent(sum(s["right"] for s in expect_call), len(expect_call)),
        "right_no_call_rate": percent(sum(s["right"] for s in expect_none), len(expect_none)),
        "text_answer_rate_after_tool_result": percent(sum(not s["attempted"] for s in after_result), len(after_result)),
        "calls_recovered_from_text": sum(s["recovered"] for s in scored),
        "answers_with_recovered_calls": sum(bool(s["recovered"]) for s in scored),
        "repeated_calls": sum(s["repeated"] for s in scored),
        "decode_tok_s": round(sum(s["completion_tokens"] - 1 for s in decoded) / decode_s, 2) if decode_s else None,
        "num_turns": len(scored), "num_attempts": len(attempts),
        "num_valid": sum(s["valid"] for s in scored), "num_right": sum(s["right"] for s in scored),
        "finish_length": sum(s["finish_reason"] == "length" for s in scored),
        "prompt_tokens_mean": round(prompt / len(scored), 1) if scored else None,
        "cached_fraction": round(sum(s["cached_tokens"] for s in scored) / prompt, 3) if prompt else None,
    }


def run_model(name: str, groups: list[dict[str, Any]], args: argparse.Namespace,
              llama_build: dict[str, Any] | None) -> dict[str, Any]:
    """Serve `name` with one profile per arm, answer every turn under each; then the same
    turns on llama.cpp's server (same GGUF) when it is built."""
    from models.catalog import find_model
    from models.provision import provision_model

    catalog_model = find_model(name)
    model_dir = provision_model(HOME, catalog_model)
    arms = ARM_SETS[args.arms]
    profiles = {arm: f"{model_dir.name}:{arm}" if lines else model_dir.name for arm, lines in arms.items()}
    config_dir = Path(tempfile.mkdtemp(prefix="mlxd-bench-tool-calls-"))
    config = config_dir / "config.toml"
    config.write_text("".join(f'[profiles."{profiles[arm]}"]\n{lines}\n' for arm, lines in arms.items() if lines))
    setups: dict[str, Any] = {}
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, config_dir, ignore_errors=True)
        server = cleanup.enter_context(mlxd_server(model_dir, max_num_seqs=args.concurrency,
                                                   extra_args=["--config", str(config)], name=f"mlxd-{name}"))
        for arm, lines in arms.items():
            setups[arm] = {**server.info, "log": str(server.log_path), "model_dir": str(model_dir),
                           "model": profiles[arm], "profile": lines or "(the model's own settings)"}
        meter = CpuMeter([server.process.pid])
        started = time.perf_counter()
        per_turn = run_groups(server.base_url, profiles, groups, args.concurrency, args.max_tokens)
        wall_s, other_cores = time.perf_counter() - started, meter.other_cores()
        decode = decode_phase(server.base_url, profiles, groups, args.concurrency, args.decode_tokens,
                              eos_token_ids(model_dir), args.decode_repeats, server.model)
    if llama_build is not None and args.arms == "grammar":
        gguf = HOME / "downloads" / catalog_model.gguf_file
        slots = args.llamacpp_concurrency
        with llamacpp_server(Path(llama_build["binary"]), gguf, threads=THREADS, parallel=slots,
                             ctx_size=slots * 12288, extra_args=["--jinja"]) as llama:
            setups["llamacpp"] = {"binary": llama_build["binary"], "version": llama_build.get("version"),
                                  "gguf": str(gguf), "threads": THREADS, "slots": slots,
                                  "flags": "--jinja (the GGUF's chat template, llama.cpp's own tool-call parser "
                                           "and lazy grammar)", "log": str(llama.log_path)}
            per_turn["llamacpp"] = run_groups(llama.base_url, {"llamacpp": gguf.name}, groups, slots,
                                              args.max_tokens)["llamacpp"]
    figures = {arm: rates(scored) for arm, scored in per_turn.items()}
    for arm, phase in decode.items():
        figures[arm]["decode_tok_s_cached"] = phase["tok_s"]
        figures[arm]["decode_phase_min_completion_tokens"] = phase["min_completion_tokens"]
        figures[arm].update({f"decode_phase_{k}": v for k, v in phase.items() if k not in ("tok_s", "min_completion_tokens")})
    for arm, arm_figures in figures.items():
        log("%s %s: %s", name, arm, {k: arm_figures.get(k) for k in ("valid_call_rate", "right_tool_rate", "decode_tok_s",
                                                                       "decode_tok_s_cached")})
    return {"setup": setups, "arms": figures, "headline": headline(figures), "wall_s_mlxd": round(wall_s, 1),
            "other_cpu_cores": other_cores,
            "turns": {arm: [{k: s[k] for k in ("id", "expected", "called", "valid", "right", "problems", "recovered",
                                               "repeated", "finish_reason", "content")} for s in scored]
                      for arm, scored in per_turn.items()}}


def headline(figures: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's keys for one model (the grammar arms), or the layout deltas."""
    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    if "constrained" not in figures:
        first, second = list(figures)[:2]
        return {f"{key}_delta_points": round(figures[first][key] - figures[second][key], 1)
                for key in ("valid_call_rate", "right_tool_rate")
                if None not in (figures[first][key], figures[second][key])}
    constrained, free = figures["constrained"], figures["free"]
    llama = figures.get("llamacpp", {})
    return {
        "valid_call_rate_constrained": constrained["valid_call_rate"],
        "valid_call_rate_free": free["valid_call_rate"],
        "right_tool_rate_delta": round(constrained["right_tool_rate"] - free["right_tool_rate"], 1),
        "decode_ratio_constrained_vs_free": ratio(constrained["decode_tok_s_cached"], free["decode_tok_s_cached"]),
        "decode_ratio_constrained_vs_free_first_pass": ratio(constrained["decode_tok_s"], free["decode_tok_s"]),
        # the same pass, each (group, pass) pair's own ratio: the median is what drift leaves alone
        "decode_ratio_paired_median": (constrained.get("decode_phase_paired_ratios_vs_free") or {}).get("median"),
        # the worker's step time per arm and the grammar's own part of it (ms per step)
        "decode_step_ms": {arm: {k: (f.get("decode_phase_step_split") or {}).get(k)
                                 for k in ("step_ms", "grammar_mask_ms", "grammar_wait_ms", "mean_batch")}
                           for arm, f in (("constrained", constrained), ("free", free))},
        "valid_call_rate_llamacpp": llama.get("valid_call_rate"),
        "right_tool_rate_llamacpp": llama.get("right_tool_rate"),
        "valid_call_rate_ratio_vs_llamacpp": ratio(constrained["valid_call_rate"], llama.get("valid_call_rate")),
        "calls_recovered_from_text": constrained["calls_recovered_from_text"],
    }


def spread(turns: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """`count` of `turns` at even steps, the first included (a group's first turn sets up
    its cached prefix)."""
    if count >= len(turns):
        return turns
    return [turns[i * len(turns) // count] for i in range(count)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), help="catalog names (default: both Qwen coders)")
    parser.add_argument("--arms", choices=sorted(ARM_SETS), default="grammar",
                        help="grammar: the lazy call grammar on, off, and llama.cpp (default); layout: the two "
                             "prompt layouts")
    parser.add_argument("--skip-llamacpp", action="store_true", help="mlxd's arms only")
    parser.add_argument("--set", type=Path, default=SET_PATH, help="the data set (default bench/tool_calls_set.json)")
    parser.add_argument("--concurrency", type=int, default=8,
                        help="requests in flight at once (default 8; the server's max_num_seqs and llama.cpp's slots)")
    parser.add_argument("--llamacpp-concurrency", type=int, default=1,
                        help="llama.cpp's slots and requests in flight (default 1: its prompt cache is per slot, so "
                             "one slot carries a group's prefix from turn to turn; with 8, every slot prefilled "
                             "the whole prompt, 6 min per five Claude Code turns on the 1.5B). Only rates are "
                             "compared with llama.cpp, not speed")
    parser.add_argument("--max-tokens", type=int, default=128, help="most tokens an answer may take (default 128)")
    parser.add_argument("--decode-tokens", type=int, default=96,
                        help="every answer's length in the decode-speed pass (EOS biased out; default 96)")
    parser.add_argument("--decode-repeats", type=int, default=2, help="passes of the decode-speed pass (default 2)")
    parser.add_argument("--limit", type=int, default=0, help="only N turns of each group, spread over it (a quicker run)")
    parser.add_argument("--out", type=Path, help="also write the JSON to this file")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    env = environment()
    groups = load_set(args.set)
    if args.limit:  # spread over each group: its later turns are the ones after tool results
        groups = [{**group, "turns": spread(group["turns"], args.limit)} for group in groups]
    llama_build = None
    if not args.skip_llamacpp and args.arms == "grammar":
        try:
            llama_build = llamacpp_build_info(ensure_llama_server())
        except Exception as exc:  # measure mlxd anyway; the JSON says why llama.cpp is missing
            log("llama-server unavailable: %s", exc)
            env["llamacpp_build_error"] = f"{type(exc).__name__}: {exc}"
    env["llamacpp_build"] = llama_build
    results: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for name in args.models:
        try:
            results[name] = run_model(name, groups, args, llama_build)
        except Exception as exc:  # keep the other model's figures; say what failed
            log("%s failed: %s", name, exc)
            errors[name] = f"{type(exc).__name__}: {exc}"
        if args.out is not None:  # each model's figures kept as soon as they are known
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report(args, groups, env, results, errors, started), indent=2) + "\n")
    emit(report(args, groups, env, results, errors, started), args.out)
    return 1 if errors or not results else 0


def report(args: argparse.Namespace, groups: list[dict[str, Any]], env: dict[str, Any], results: dict[str, Any],
           errors: dict[str, str], started: float) -> dict[str, Any]:
    """The JSON of a run: the headline figures and targets first, then the set, the setup,
    each model's figures and its answers turn by turn."""
    turns = [turn for group in groups for turn in group["turns"]]
    targets: dict[str, Any] = {}
    for name, result in results.items():
        h = result["headline"]
        if args.arms != "grammar":
            continue
        targets[f"{name}_valid_call_rate_constrained"] = {"target": "100%", "value": h["valid_call_rate_constrained"],
                                                           "met": h["valid_call_rate_constrained"] == 100.0}
        targets[f"{name}_right_tool_rate_delta"] = {"target": ">= 0 points", "value": h["right_tool_rate_delta"],
                                                     "met": h["right_tool_rate_delta"] >= 0}
        targets[f"{name}_decode_ratio_constrained_vs_free"] = {
            "target": ">= 0.95", "value": h["decode_ratio_constrained_vs_free"],
            "met": (h["decode_ratio_constrained_vs_free"] or 0) >= 0.95}
        if h["valid_call_rate_llamacpp"] is not None:  # the ratio is null when llama.cpp's rate is 0
            targets[f"{name}_valid_call_rate_ratio_vs_llamacpp"] = {
                "target": ">= 1 (mlxd's rate at least llama.cpp's)", "value": h["valid_call_rate_ratio_vs_llamacpp"],
                "mlxd": h["valid_call_rate_constrained"], "llamacpp": h["valid_call_rate_llamacpp"],
                "met": h["valid_call_rate_constrained"] >= h["valid_call_rate_llamacpp"]}
    return {
        "benchmark": "tool_calls",
        "summary": {name: r["headline"] for name, r in results.items()},
        "targets": targets,
        "all_met": bool(targets) and all(t["met"] for t in targets.values()) and not errors,
        "set": {"path": str(args.set.relative_to(REPO) if args.set.is_relative_to(REPO) else args.set),
                "limit_per_group": args.limit or None,
                "num_turns": len(turns), "num_expect_call": sum(t["expected"] is not None for t in turns),
                "num_expect_no_call": sum(t["expected"] is None for t in turns),
                "num_after_tool_result": sum(any(m["role"] == "tool" for m in t["messages"]) for t in turns),
                "groups": {g["name"]: {"num_turns": len(g["turns"]), "num_tools": len(g["tools"]), "source": g["source"]}
                           for g in groups}},
        "config": {"endpoint": CHAT + " (non-streaming, temperature 0, tool_choice auto)",
                   "max_tokens": args.max_tokens, "decode_tokens": args.decode_tokens, "decode_repeats": args.decode_repeats,
                   "concurrency": args.concurrency, "arms": args.arms,
                   "llamacpp_concurrency": args.llamacpp_concurrency,
                   "mlxd_profiles": ARM_SETS[args.arms], "models": args.models, "home": str(HOME)},
        "environment": {**env, "loadavg_1m_now": round(os.getloadavg()[0], 2)},
        "results": results,
        "errors": errors,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }


if __name__ == "__main__":
    sys.exit(main())
