"""Speculative decoding, side by side: mlxd plain, with prompt lookup and with the 0.5B
as its draft model against
llama.cpp's `llama-server` plain, with a draft model and with its n-gram speculation, on
Qwen2.5-Coder-1.5B (the same GGUF and thread count for every contender; llama.cpp's draft
model is the 0.5B's GGUF, the offline pair).

Workloads, greedy, each at batch 1 and with `--batch` requests in flight:
- edit: a ~150-line source file of this repository in the prompt, "rename this variable
  and return the whole file" (a coding agent's edit turn: most of the answer copies the
  prompt), answers cut at `--max-tokens`;
- free: a free-form explanation (little to copy: speculation must not cost here).

Per contender and workload: decode tok/s per stream (completion tokens after the first
over the server's own decode time: mlxd's `mlxd.timings.decode_s`, llama.cpp's
`timings.predicted_ms`), draft tokens proposed and accepted, and whether every answer
equals its server's plain answer token for token (`identical_to_plain`). mlxd's contenders
are two profiles of one loaded model (`speculation = "off"` and `"prompt_lookup"`), then
on a second server the 1.5B with the 0.5B as its `draft_model` (`speculation =
"draft_model"`: lookup where the text repeats, the draft model elsewhere); each request's
prompt is seen once by each (the prefix cache only shortens prefill, which the decode
rate leaves out). One JSON object on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from common import REPO, emit, environment, llamacpp_server, log, mlxd_server
from engine import ensure_llama_server, llamacpp_build_info

HOME = Path(os.environ.get("MLXD_TEST_HOME", REPO / ".cache" / "test-home"))
TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"  # catalog names (models/catalog.py)
THREADS = 2
# (file, variable to rename, its new name): real files of this repository, ~150 lines each
EDITS = [
    ("worker/hot_tier.py", "entry", "record"),
    ("worker/call_budget.py", "order", "ranking"),
    ("worker/grammar_batch.py", "processor", "proc"),
    ("worker/tool_prompt.py", "tools", "functions"),
]
TOPICS = [
    "how TCP congestion control reacts to packet loss",
    "why garbage collectors pause programs and how generational collection helps",
    "how a B-tree keeps itself balanced on insertion",
    "what makes floating-point addition non-associative",
]
# server -> its arms (arm -> the profile's speculation): the default setup, then the 1.5B
# with the 0.5B as its draft model (whose KV every prefill computes too)
MLXD_SERVERS = {"mlxd-speculative": {"plain": "off", "prompt_lookup": "prompt_lookup"},
                "mlxd-draft-model": {"draft_model": "draft_model"}}


def edit_prompt(path: str, old: str, new: str) -> str:
    source = (REPO / path).read_text()
    return (f"Rename the variable `{old}` to `{new}` everywhere in this file. Reply with the whole updated file "
            f"only, in one code block.\n\n```python\n{source}```")


def free_prompt(topic: str) -> str:
    return f"Explain {topic}, in plain prose, for an experienced programmer."


def workloads(batch: int) -> dict[str, tuple[list[str], int]]:
    """workload name -> (its prompts, how many are in flight at once). Batch 1 asks every
    prompt, one after another (one answer alone swings by 10% from file to file)."""
    edits = [edit_prompt(*e) for e in EDITS]
    frees = [free_prompt(t) for t in TOPICS]
    return {"edit_b1": (edits, 1), "free_b1": (frees, 1), f"edit_b{batch}": (edits[:batch], batch),
            f"free_b{batch}": (frees[:batch], batch)}


def ask(client: httpx.Client, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """One greedy chat completion; its text, token count, decode time and drafts."""
    response = client.post("/v1/chat/completions", json={
        "model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
        "temperature": 0.0})
    response.raise_for_status()
    body = response.json()
    used = body["usage"]["completion_tokens"]
    mine = (body.get("mlxd") or {}).get("timings")
    if mine is not None:
        decode_s, drafted, kept = mine["decode_s"], mine.get("draft_tokens", 0), mine.get("draft_accepted", 0)
    else:  # llama.cpp's
        t = body.get("timings") or {}
        decode_s = t.get("predicted_ms", 0.0) / 1000.0
        drafted, kept = t.get("draft_n", 0), t.get("draft_n_accepted", 0)
    return {"text": body["choices"][0]["message"].get("content") or "", "tokens": used, "decode_s": decode_s,
            "drafted": drafted, "kept": kept}


def run_workload(base_url: str, model: str, load: tuple[list[str], int], max_tokens: int) -> dict[str, Any]:
    prompts, in_flight = load
    with httpx.Client(base_url=base_url, timeout=httpx.Timeout(3600.0)) as client, \
            ThreadPoolExecutor(in_flight) as pool:
        started = time.perf_counter()
        answers = list(pool.map(lambda p: ask(client, model, p, max_tokens), prompts))
        wall = time.perf_counter() - started
    rates = [(a["tokens"] - 1) / a["decode_s"] for a in answers if a["decode_s"] and a["tokens"] > 1]
    drafted, kept = sum(a["drafted"] for a in answers), sum(a["kept"] for a in answers)
    return {"decode_tok_s": round(sum(rates) / len(rates), 2) if rates else None,
            "aggregate_tok_s": round(sum(a["tokens"] for a in answers) / wall, 2),
            "completion_tokens": [a["tokens"] for a in answers], "draft_tokens": drafted, "draft_accepted": kept,
            "acceptance": round(kept / drafted, 3) if drafted else None,
            "per_request_tok_s": [round(r, 2) for r in rates],
            "texts": [a["text"] for a in answers]}


def run_contender(base_url: str, model: str, loads: dict[str, tuple[list[str], int]],
                  max_tokens: int) -> dict[str, Any]:
    out = {}
    for name, load in loads.items():
        out[name] = run_workload(base_url, model, load, max_tokens)
        log("%s %s: %s tok/s, acceptance %s", model, name, out[name]["decode_tok_s"], out[name]["acceptance"])
    return out


def identical(results: dict[str, Any], plain: dict[str, Any]) -> bool:
    return all(results[w]["texts"] == plain[w]["texts"] for w in plain)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-tokens", type=int, default=384, help="answer length cap (default 384)")
    parser.add_argument("--batch", type=int, default=4, help="requests in flight in the batched workloads")
    parser.add_argument("--skip-llamacpp", action="store_true", help="mlxd's contenders only")
    parser.add_argument("--out", type=Path, help="also write the JSON to this file")
    args = parser.parse_args(argv)
    from models.catalog import find_model
    from models.provision import provision_model

    started = time.perf_counter()
    target, draft = find_model(TARGET), find_model(DRAFT)
    model_dir = provision_model(HOME, target)
    provision_model(HOME, draft)
    loads = workloads(args.batch)
    results: dict[str, Any] = {}
    setups: dict[str, Any] = {}
    config_dir = Path(tempfile.mkdtemp(prefix="mlxd-bench-speculative-"))
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, config_dir, ignore_errors=True)
        for name, arms in MLXD_SERVERS.items():
            drafted = "draft_model" in arms
            config = config_dir / f"{name}.toml"
            config.write_text((f'[models."{model_dir.name}"]\ndraft_model = "{DRAFT}"\n' if drafted else "") + "".join(
                f'[profiles."{model_dir.name}:{arm}"]\nspeculation = "{mode}"\n' for arm, mode in arms.items()))
            with mlxd_server(model_dir, max_num_seqs=max(8, args.batch), name=name,
                             extra_args=["--config", str(config), "--model-dir", str(model_dir.parent)]) as server:
                for arm, mode in arms.items():
                    setups[f"mlxd_{arm}"] = {**server.info, "model_dir": str(model_dir), "speculation": mode,
                                             "draft_model": DRAFT if drafted else None, "log": str(server.log_path)}
                    results[f"mlxd_{arm}"] = {}
                for i, (workload, load) in enumerate(loads.items()):  # arm after arm, the order alternating
                    for arm in list(arms)[::1 if i % 2 == 0 else -1]:
                        figures = run_workload(server.base_url, f"{model_dir.name}:{arm}", load, args.max_tokens)
                        results[f"mlxd_{arm}"][workload] = figures
                        log("mlxd %s %s: %s tok/s, acceptance %s", arm, workload, figures["decode_tok_s"],
                            figures["acceptance"])
    if not args.skip_llamacpp:
        build = llamacpp_build_info(ensure_llama_server())
        target_gguf, draft_gguf = HOME / "downloads" / target.gguf_file, HOME / "downloads" / draft.gguf_file
        contenders = {
            "llamacpp_plain": [],
            "llamacpp_draft": ["--spec-type", "draft-simple", "--model-draft", str(draft_gguf),
                               "--threads-draft", str(THREADS)],
            "llamacpp_ngram": ["--spec-type", "ngram-simple"],
        }
        for name, extra in contenders.items():
            slots = args.batch
            with llamacpp_server(Path(build["binary"]), target_gguf, threads=THREADS, parallel=slots,
                                 ctx_size=slots * 4096, extra_args=extra) as llama:
                setups[name] = {"binary": build["binary"], "version": build.get("version"), "gguf": str(target_gguf),
                                "threads": THREADS, "slots": slots, "flags": " ".join(extra) or "(none)",
                                "log": str(llama.log_path)}
                results[name] = run_contender(llama.base_url, target_gguf.name, loads, args.max_tokens)
    emit(report(args, loads, results, setups, started), args.out)
    return 0


def report(args: argparse.Namespace, loads: dict[str, list[str]], results: dict[str, Any], setups: dict[str, Any],
           started: float) -> dict[str, Any]:
    def rate(contender: str, workload: str) -> float | None:
        return (results.get(contender) or {}).get(workload, {}).get("decode_tok_s")

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a and b else None

    speculative = {"mlxd_prompt_lookup": "mlxd_plain", "mlxd_draft_model": "mlxd_plain",
                   "llamacpp_draft": "llamacpp_plain",
                   "llamacpp_ngram": "llamacpp_plain"}
    identical_to_plain = {name: identical(results[name], results[plain])
                          for name, plain in speculative.items() if name in results and plain in results}
    mlxd_best = max((n for n in speculative if n.startswith("mlxd") and n in results),
                    key=lambda n: rate(n, "edit_b1") or 0.0, default=None)
    llama_best = max((n for n in speculative if n.startswith("llamacpp") and n in results),
                     key=lambda n: rate(n, "edit_b1") or 0.0, default=None)
    summary = {
        "edit_speedup_vs_plain": ratio(rate(mlxd_best, "edit_b1"), rate("mlxd_plain", "edit_b1")) if mlxd_best else None,
        "edit_ratio_vs_llamacpp_speculative": (ratio(rate(mlxd_best, "edit_b1"), rate(llama_best, "edit_b1"))
                                               if mlxd_best and llama_best else None),
        "free_text_speedup_vs_plain": (ratio(rate(mlxd_best, "free_b1"), rate("mlxd_plain", "free_b1"))
                                       if mlxd_best else None),
        f"edit_b{args.batch}_speedup_vs_plain": (ratio(rate(mlxd_best, f"edit_b{args.batch}"),
                                                      rate("mlxd_plain", f"edit_b{args.batch}")) if mlxd_best else None),
        f"free_b{args.batch}_speedup_vs_plain": (ratio(rate(mlxd_best, f"free_b{args.batch}"),
                                                      rate("mlxd_plain", f"free_b{args.batch}")) if mlxd_best else None),
        "identical_to_plain": identical_to_plain,
        "mlxd_best_speculative": mlxd_best, "llamacpp_best_speculative": llama_best,
        "draft_model_speedup_vs_plain": {w: ratio(rate("mlxd_draft_model", w), rate("mlxd_plain", w)) for w in loads},
        "tok_s": {name: {w: rate(name, w) for w in loads} for name in results},
    }
    targets = {
        "edit_speedup_vs_plain": {"target": ">= 2.0", "value": summary["edit_speedup_vs_plain"],
                                  "met": (summary["edit_speedup_vs_plain"] or 0) >= 2.0},
        "edit_ratio_vs_llamacpp_speculative": {"target": ">= 1.0", "value": summary["edit_ratio_vs_llamacpp_speculative"],
                                               "met": (summary["edit_ratio_vs_llamacpp_speculative"] or 0) >= 1.0},
        "free_text_speedup_vs_plain": {"target": ">= 0.98 (never slower, within this machine's run-to-run noise)",
                                       "value": summary["free_text_speedup_vs_plain"],
                                       "met": (summary["free_text_speedup_vs_plain"] or 0) >= 0.98},
        "identical_to_plain": {"target": "true for every mlxd arm",
                               "value": all(v for k, v in identical_to_plain.items() if k.startswith("mlxd")),
                               "met": all(v for k, v in identical_to_plain.items() if k.startswith("mlxd"))
                               and "mlxd_prompt_lookup" in identical_to_plain},
    }
    for name in results:  # the texts are compared above; the JSON keeps their digests
        for figures in results[name].values():
            figures["text_sha1"] = [hashlib.sha1(t.encode()).hexdigest()[:12] for t in figures.pop("texts")]
    return {
        "benchmark": "speculative", "summary": summary, "targets": targets,
        "all_met": all(t["met"] for t in targets.values()),
        "config": {"target": TARGET, "draft": DRAFT, "max_tokens": args.max_tokens, "batch": args.batch,
                   "threads": THREADS, "edits": [{"file": f, "rename": [a, b]} for f, a, b in EDITS],
                   "topics": TOPICS, "temperature": 0.0},
        "setup": setups, "results": results, "environment": environment(),
        "elapsed_s": round(time.perf_counter() - started, 1),
    }


if __name__ == "__main__":
    sys.exit(main())
