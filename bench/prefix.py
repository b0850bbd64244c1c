"""Agent-shaped prefix reuse: how fast is each turn of a growing conversation?

A ~2K-token fixed prefix (system prompt + tool definitions) and 6 turns, each adding a
~100-token user message and asking 32 greedy tokens, against (a) mlxd with its prefix
cache, (b) the same mlxd with `--no-prefix-cache`, and (c) `mlx_lm.server` (its own
prompt cache) on the same fp32 weights and BLAS. TTFT is measured on the client (request
sent -> first streamed content). Prints one JSON object; progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from common import (
    emit,
    environment,
    log,
    mlxd_server,
    peer_server,
    prepare_fp32_model,
    run_concurrently,
    wait_for_quiet,
)

TOOLS = [
    ("read_file", "Read a file from the workspace and return its contents with line numbers."),
    ("write_file", "Write the given contents to a file, creating parent directories as needed."),
    ("list_directory", "List the entries of a directory, marking subdirectories with a slash."),
    ("search_code", "Search the workspace for a regular expression and return matching lines."),
    ("run_tests", "Run the project's test suite, or one test file, and return the summary."),
    ("git_diff", "Show the uncommitted changes of the repository as a unified diff."),
    ("git_log", "Show the most recent commits with their authors and messages."),
    ("apply_patch", "Apply a unified diff to the workspace and report any rejected hunks."),
    ("run_command", "Run a shell command in the workspace with a timeout and return its output."),
    ("open_url", "Fetch a documentation page and return it as plain text."),
    ("find_symbol", "Find where a function, class or variable is defined in the workspace."),
    ("format_code", "Format a file with the project's configured formatter."),
]

USER_TURNS = [
    "The test suite fails in the parser module after my last change. Look at the parser, find which "
    "function handles nested brackets, explain what it does step by step, and tell me which tests "
    "cover it. Keep the answer short and point to exact line numbers where you can.",
    "Thanks. Now check whether the tokenizer module has the same bug with nested quotes inside "
    "brackets. If it does, propose the smallest patch that fixes both places, and list the commands "
    "you would run to verify the fix before committing it to the main branch.",
    "Before applying anything, search the code for other callers of the bracket handler and tell me "
    "whether any of them depend on the old behaviour. Mention the files and functions by name and "
    "say how risky the change is for each of them, from low to high.",
    "Apply the patch to the parser only, run the parser tests, and summarize the result. If a test "
    "still fails, show me its name and the assertion that failed, and guess at the cause in one or "
    "two sentences without changing any other file yet.",
    "The remaining failure is in the error message text. Update the expected message in the test to "
    "match the new wording, rerun the whole suite, and write a commit message that explains the bug, "
    "the fix and the test change in three short lines.",
    "Finally, look at the git log for the last five commits and tell me whether any earlier commit "
    "touched the bracket handler. If one did, name it and say whether our fix could conflict with "
    "the intent of that earlier change, and how we would notice if it did.",
]


def system_prompt() -> str:
    """~2K tokens: an agent's instructions plus JSON tool schemas, as coding agents send."""
    rules = [
        f"Rule {i}: when you {verb}, always {action} and never {avoid}."
        for i, (verb, action, avoid) in enumerate(
            [("edit a file", "keep the existing style", "reformat unrelated lines"),
             ("run a command", "explain why first", "run destructive commands"),
             ("answer a question", "cite file paths", "guess at APIs you have not read"),
             ("write a test", "make it fail first", "mock what you can run for real"),
             ("review a diff", "read it whole", "approve code you did not run")] * 5
        )
    ]
    schemas = [
        json.dumps({"type": "function", "function": {"name": name, "description": desc, "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "path relative to the workspace root"},
                           "limit": {"type": "integer", "description": "maximum number of lines or results"},
                           "options": {"type": "object", "description": "tool specific options"}},
            "required": ["path"]}}})
        for name, desc in TOOLS
    ]
    return ("You are a careful coding agent working in the user's repository.\n" + "\n".join(rules)
            + "\n\nYou can call these tools:\n" + "\n".join(schemas))


def run_conversation(base_url: str, model: str, max_tokens: int, extra: dict[str, Any]) -> list[dict[str, Any]]:
    """Six turns, each resending the whole history; returns per-turn client timings."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt()}]
    turns = []
    for i, user in enumerate(USER_TURNS):
        messages.append({"role": "user", "content": user})
        body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra}
        (result,) = run_concurrently(base_url, [body], path="/v1/chat/completions")
        turns.append({"turn": i + 1, "ttft_s": round(result.ttft_s or 0.0, 3),
                      "prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens})
        log("  turn %d: %d prompt tokens, ttft %.2f s", i + 1, result.prompt_tokens or 0, result.ttft_s or 0)
        messages.append({"role": "assistant", "content": result.text})
    return turns


def warm_up(base_url: str, model: str) -> None:
    """One short request first, so no turn pays for first-call setup."""
    body = {"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2}
    run_concurrently(base_url, [body], path="/v1/chat/completions")


def summary(turns: list[dict[str, Any]]) -> dict[str, Any]:
    warm = [t["ttft_s"] for t in turns[1:]]
    return {"turns": turns, "cold_ttft_s": turns[0]["ttft_s"],
            "warm_mean_ttft_s": round(sum(warm) / len(warm), 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=32, help="new tokens per turn (default 32)")
    parser.add_argument("--skip-peer", action="store_true", help="do not run mlx_lm.server")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()

    started = time.monotonic()
    model_dir = prepare_fp32_model()
    results: dict[str, Any] = {}
    runs = [("mlxd", []), ("mlxd_uncached", ["--no-prefix-cache"])]
    for name, flags in runs:
        wait_for_quiet(60)
        log("%s: 6 turns", name)
        with mlxd_server(model_dir, extra_args=flags) as server:
            warm_up(server.base_url, server.model)
            results[name] = summary(run_conversation(server.base_url, server.model, args.max_tokens, {}))
    if not args.skip_peer:
        wait_for_quiet(60)
        log("peer (mlx_lm.server): 6 turns")
        with peer_server(model_dir) as server:
            warm_up(server.base_url, server.model)
            results["peer"] = summary(run_conversation(server.base_url, server.model, args.max_tokens, {}))

    out: dict[str, Any] = {
        "scenario": "prefix",
        "speedup_vs_uncached": round(results["mlxd_uncached"]["warm_mean_ttft_s"] / results["mlxd"]["warm_mean_ttft_s"], 2),
        "ratio_vs_peer": (round(results["mlxd"]["warm_mean_ttft_s"] / results["peer"]["warm_mean_ttft_s"], 3)
                          if "peer" in results else None),
        **results,
        "environment": environment(),
        "runtime_s": round(time.monotonic() - started, 1),
    }
    emit(out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
