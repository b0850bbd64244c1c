"""Run every benchmark scenario in bench/, one at a time, and print their JSON as one object.

A scenario is any `bench/*.py` but this runner, `common.py` and `_*.py` helpers. They run
sequentially because on a 2-core machine two benchmarks at once spoil both.
`make bench` calls this.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import emit

BENCH_DIR = Path(__file__).resolve().parent
# agent_clients.py and claude_code_compaction.py drive the real Claude Code and Codex CLIs
# against a service you started (opt-in); dashboard_screenshot.py is no benchmark: it draws
# the README's picture of the dashboard
NOT_SCENARIOS = {"run_all.py", "common.py", "agent_clients.py", "claude_code_compaction.py",
                 "dashboard_screenshot.py"}
# These build llama.cpp on first use or answer hundreds of turns, and run for far longer than
# the others (engine.py: four servers on two models; agent_session.py: a 20-turn session on
# three servers; tool_calls.py: 100+ turns twice on two Qwen models): only with --only
LONG_SCENARIOS = {"engine.py", "agent_session.py", "tool_calls.py"}


def scenarios(long: bool = False) -> list[Path]:
    """The scenario scripts, in name order; the long ones too if `long`."""
    excluded = NOT_SCENARIOS if long else NOT_SCENARIOS | LONG_SCENARIOS
    return sorted(p for p in BENCH_DIR.glob("*.py") if p.name not in excluded and not p.name.startswith("_"))


def run_scenario(script: Path) -> dict[str, Any]:
    """Run one scenario (its progress passes through on stderr); its stdout must be JSON."""
    started = time.perf_counter()
    completed = subprocess.run([sys.executable, str(script)], check=False, stdout=subprocess.PIPE, text=True,
                               cwd=BENCH_DIR.parent)
    elapsed = round(time.perf_counter() - started, 1)
    try:
        result = json.loads(completed.stdout)
    except json.JSONDecodeError:
        return {"error": "no JSON on stdout", "exit_code": completed.returncode,
                "stdout_tail": completed.stdout[-2000:], "elapsed_s": elapsed}
    if completed.returncode != 0:
        result = {**result, "exit_code": completed.returncode}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", metavar="NAME",
                        help="run only this scenario (file name without .py; the long ones, "
                             f"{', '.join(sorted(n.removesuffix('.py') for n in LONG_SCENARIOS))}, run only "
                             "when named); repeatable")
    parser.add_argument("--out", type=Path, help="also write the JSON to this file")
    args = parser.parse_args(argv)
    selected = [s for s in scenarios(long=bool(args.only)) if not args.only or s.stem in args.only]
    if args.only and len(selected) != len(set(args.only)):
        known = ", ".join(s.stem for s in scenarios(long=True))
        parser.error(f"unknown scenario in {args.only}; known: {known}")
    results: dict[str, Any] = {}
    for script in selected:
        sys.stderr.write(f"run_all: {script.stem}\n")
        results[script.stem] = run_scenario(script)
    emit(results, args.out)
    return 1 if any("exit_code" in r or "error" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
