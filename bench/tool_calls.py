"""Tool calls under both prompt layouts: does putting the tools before the system text
(`prompt_layout = "stable_first"`, the default) cost the model anything against the chat
template's own layout (`"template"`)?

The fixed set `bench/tool_calls_set.json` holds 100+ tool-calling turns in groups, one per
tool set of a captured client (Claude Code, OpenCode, Codex, openai-python, anthropic-python:
the real schemas of tests/clients/, with short real descriptions where the capture has
placeholders): single tools and many, enums, nested objects, turns after a tool result, and
turns whose right answer is text. Each model runs in mlxd (this checkout) with a profile
`MODEL:template` whose prompt_layout is `template`, so both layouts are answered by the same
loaded model; every turn is sent under each layout (greedy, /v1/chat/completions, tool_choice
auto), both layouts side by side in the same batches: a group's first turn first (its tools
and system text are then cached), the rest `--concurrency` requests at a time.

Per model and layout: the valid-call rate (of the answers that attempt a call: every call
parses, names an offered tool, and its arguments validate against that tool's JSON schema;
call markup the server could not parse counts as an invalid attempt), the same over the turns
that expect a call, the right-tool rate (over all turns: the first call names the expected
tool, or there is no call when none is expected), and stable_first minus template in points.
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

from common import REPO, CpuMeter, emit, environment, log, mlxd_server

HOME = Path(os.environ.get("MLXD_TEST_HOME", REPO / ".cache" / "test-home"))  # the tests' provisioned models
SET_PATH = Path(__file__).resolve().parent / "tool_calls_set.json"
MODELS = ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")  # catalog names (models/catalog.py)
LAYOUTS = ("stable_first", "template")
CHAT = "/v1/chat/completions"
MAX_POINTS_LOST = 2.0  # done when stable_first is no worse than this on both rates
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


def ask(client: httpx.Client, model: str, group: dict[str, Any], turn: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """One turn, answered greedily; the answer as the OpenAI API gives it, timed."""
    body = {"model": model, "temperature": 0, "max_tokens": max_tokens, "tools": group["tools"],
            "messages": [{"role": "system", "content": group["system"]}, *turn["messages"]]}
    started = time.perf_counter()
    response = client.post(CHAT, json=body)
    if response.status_code != 200:
        raise RuntimeError(f"{turn['id']}: {response.status_code} {response.text[:300]}")
    answer = response.json()
    answer["elapsed_s"] = time.perf_counter() - started
    return answer


def score(group: dict[str, Any], turn: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """What one answer did: its calls, whether it attempted one, whether every call is valid,
    whether it chose right."""
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
    return {
        "id": turn["id"], "expected": expected, "called": [call["function"]["name"] for call in calls],
        "attempted": attempted, "valid": attempted and not unparsed and not problems, "right": right,
        "problems": problems + (["call markup returned as text"] if unparsed else []),
        "finish_reason": choice.get("finish_reason"), "content": content[:120],
        "prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
        "completion_tokens": usage.get("completion_tokens"), "elapsed_s": round(answer["elapsed_s"], 2),
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


def run_groups(base_url: str, models: dict[str, str], groups: list[dict[str, Any]], concurrency: int,
               max_tokens: int) -> dict[str, list[dict[str, Any]]]:
    """Every turn under every layout (`models`: layout -> the model name that selects it),
    both layouts side by side in one batch, so neither meets a busier machine than the
    other; each group's first turn first (under both layouts at once), so that its other
    turns find the group's tools and system text cached."""
    scored: dict[str, list[dict[str, Any]]] = {layout: [] for layout in models}
    with httpx.Client(base_url=base_url, timeout=httpx.Timeout(3600.0)) as client, \
            ThreadPoolExecutor(concurrency) as pool:
        for group in groups:
            first, *rest = group["turns"]
            jobs = [(layout, first) for layout in models]
            answers = list(pool.map(lambda job: ask(client, models[job[0]], group, job[1], max_tokens), jobs))
            jobs_rest = [(layout, turn) for turn in rest for layout in models]
            answers += list(pool.map(lambda job: ask(client, models[job[0]], group, job[1], max_tokens), jobs_rest))
            for (layout, turn), answer in zip(jobs + jobs_rest, answers):
                scored[layout].append(score(group, turn, answer))
            for layout in models:
                mine = [s for s in scored[layout] if s["id"].startswith(group["name"] + "-")]
                log("%s %s: %d/%d right, %d valid of %d attempts", layout, group["name"], sum(s["right"] for s in mine),
                    len(mine), sum(s["valid"] for s in mine), sum(s["attempted"] for s in mine))
    return scored


def rates(scored: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of one model under one layout."""
    attempts = [s for s in scored if s["attempted"]]
    expect_call = [s for s in scored if s["expected"] is not None]
    expect_none = [s for s in scored if s["expected"] is None]
    prompt = sum(s["prompt_tokens"] or 0 for s in scored)

    def percent(part: int, whole: int) -> float | None:
        return round(100.0 * part / whole, 1) if whole else None

    return {
        "valid_call_rate": percent(sum(s["valid"] for s in attempts), len(attempts)),
        "valid_call_rate_of_expected": percent(sum(s["valid"] for s in expect_call), len(expect_call)),
        "right_tool_rate": percent(sum(s["right"] for s in scored), len(scored)),
        "right_tool_rate_expected_call": percent(sum(s["right"] for s in expect_call), len(expect_call)),
        "right_no_call_rate": percent(sum(s["right"] for s in expect_none), len(expect_none)),
        "num_turns": len(scored), "num_attempts": len(attempts),
        "num_valid": sum(s["valid"] for s in scored), "num_right": sum(s["right"] for s in scored),
        "finish_length": sum(s["finish_reason"] == "length" for s in scored),
        "prompt_tokens_mean": round(prompt / len(scored), 1) if scored else None,
        "cached_fraction": round(sum(s["cached_tokens"] for s in scored) / prompt, 3) if prompt else None,
    }


def run_model(name: str, groups: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Serve `name` with a template-layout profile, answer every turn under both layouts."""
    from models.catalog import find_model
    from models.provision import provision_model

    model_dir = provision_model(HOME, find_model(name))
    profile = f"{model_dir.name}:template"
    config_dir = Path(tempfile.mkdtemp(prefix="mlxd-bench-tool-calls-"))
    config = config_dir / "config.toml"
    config.write_text(f'[profiles."{profile}"]\nprompt_layout = "template"\n')
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, config_dir, ignore_errors=True)
        server = cleanup.enter_context(mlxd_server(model_dir, max_num_seqs=args.concurrency,
                                                   extra_args=["--config", str(config)], name=f"mlxd-{name}"))
        setup = {**server.info, "log": str(server.log_path), "model_dir": str(model_dir), "template_profile": profile}
        meter = CpuMeter([server.process.pid])
        started = time.perf_counter()
        per_turn = run_groups(server.base_url, {"stable_first": server.model, "template": profile}, groups,
                              args.concurrency, args.max_tokens)
        wall_s, other_cores = time.perf_counter() - started, meter.other_cores()
    layouts = {layout: rates(scored) for layout, scored in per_turn.items()}
    for layout in LAYOUTS:
        log("%s %s: %s", name, layout, {k: layouts[layout][k] for k in ("valid_call_rate", "right_tool_rate")})
    stable, template = layouts["stable_first"], layouts["template"]
    deltas = {key: round(stable[key] - template[key], 1) for key in
              ("valid_call_rate", "valid_call_rate_of_expected", "right_tool_rate") if None not in (stable[key], template[key])}
    differ = [{"id": a["id"], "expected": a["expected"], "stable_first": a["called"] or a["content"][:60],
               "template": b["called"] or b["content"][:60]}
              for a, b in zip(per_turn["stable_first"], per_turn["template"]) if (a["called"], a["valid"], a["right"])
              != (b["called"], b["valid"], b["right"])]
    return {"setup": setup, "layouts": layouts, "delta_points": deltas, "wall_s": round(wall_s, 1),
            "other_cpu_cores": other_cores, "turns_that_differ": differ,
            "turns": {layout: [{k: s[k] for k in ("id", "expected", "called", "valid", "right", "problems",
                                                 "finish_reason")} for s in scored]
                      for layout, scored in per_turn.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), help="catalog names (default: both Qwen coders)")
    parser.add_argument("--set", type=Path, default=SET_PATH, help="the data set (default bench/tool_calls_set.json)")
    parser.add_argument("--concurrency", type=int, default=8,
                        help="requests in flight at once, both layouts together (default 8; the server's max_num_seqs)")
    parser.add_argument("--max-tokens", type=int, default=128, help="most tokens an answer may take (default 128)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N turns of each group (a quick look)")
    parser.add_argument("--out", type=Path, help="also write the JSON to this file")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    env = environment()
    groups = load_set(args.set)
    if args.limit:
        groups = [{**group, "turns": group["turns"][: args.limit]} for group in groups]
    results: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for name in args.models:
        try:
            results[name] = run_model(name, groups, args)
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
    targets = {
        f"{name}_{key}": {"target": f"stable_first - template >= -{MAX_POINTS_LOST} points",
                          "value": result["delta_points"].get(key),
                          "met": result["delta_points"].get(key, -1e9) >= -MAX_POINTS_LOST}
        for name, result in results.items() for key in ("valid_call_rate", "right_tool_rate")
    }
    return {
        "benchmark": "tool_calls",
        "summary": {name: {layout: {k: r["layouts"][layout][k] for k in ("valid_call_rate", "right_tool_rate")}
                           for layout in LAYOUTS} | {"delta_points": r["delta_points"]}
                    for name, r in results.items()},
        "targets": targets,
        "all_met": bool(targets) and all(t["met"] for t in targets.values()) and not errors,
        "set": {"path": str(args.set.relative_to(REPO) if args.set.is_relative_to(REPO) else args.set),
                "num_turns": len(turns), "num_expect_call": sum(t["expected"] is not None for t in turns),
                "num_expect_no_call": sum(t["expected"] is None for t in turns),
                "num_after_tool_result": sum(any(m["role"] == "tool" for m in t["messages"]) for t in turns),
                "groups": {g["name"]: {"num_turns": len(g["turns"]), "num_tools": len(g["tools"]), "source": g["source"]}
                           for g in groups}},
        "config": {"endpoint": CHAT + " (non-streaming, temperature 0, tool_choice auto)",
                   "max_tokens": args.max_tokens, "concurrency": args.concurrency, "layouts": LAYOUTS,
                   "models": args.models, "home": str(HOME)},
        "environment": {**env, "loadavg_1m_now": round(os.getloadavg()[0], 2)},
        "results": results,
        "errors": errors,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }


if __name__ == "__main__":
    sys.exit(main())
