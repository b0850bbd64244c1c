"""A real Claude Code session that outgrows the model's context window (opt-in).

Claude Code believes an unknown model has a 1M-token window, so it never compacts on its
own before a local model's window overflows. mlxd's answer is the 400 Anthropic's API
gives, `prompt is too long: N tokens > W maximum`: Claude Code parses the two numbers and
compacts (summarises the oldest turns) and retries by itself. This script shows that
happening: one `claude -p --input-format stream-json` session of three turns, the last
two pasting text of `--paste-tokens` tokens each, against a service whose window is small
enough that turn 3 does not fit. Serve the model behind a profile with a `context_limit`:

  # HOME/config.toml
  [profiles."qwen2.5-coder-0.5b:window"]
  context_limit = 7000
  max_output_tokens = 512
  [model_aliases]
  "claude-*" = "qwen2.5-coder-0.5b:window"

  mlxd serve --model qwen2.5-coder-0.5b --port 8123
  python bench/claude_code_compaction.py --base-url http://127.0.0.1:8123 --paste-tokens 2500 \
      --claude-arg=--tools --claude-arg=Read

With `--tools Read` Claude Code's own prompt is ~2.3k tokens, so a 7k window holds it and
one paste, not two; with its 24 default tools the prompt is ~19k tokens (use a ~25k window
and 3500-token pastes). The transcript shows the compaction (`[compact_boundary]`); the
service log shows the 400 and the prefix hits of the summarising request and the retry.
Prints one JSON summary; exit 0 when the session compacted and every turn succeeded.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # agent_clients is a sibling script, not a package

from agent_clients import (
    CACHE_DIR,
    CLAUDE_PKG,
    CLAUDE_VERSION,
    Missing,
    check_server,
    claude_session_runs,
    emit,
    ensure_clis,
    log,
)

ANIMALS = ["heron", "otter", "badger", "lynx", "marten", "falcon", "beaver", "ibis", "stoat", "wren"]
PLACES = ["the north ridge", "the old mill", "the reed bed", "the upper meadow", "the east bank",
          "the quarry pond", "the birch wood", "the salt marsh"]


def field_notes(start: int, tokens: int) -> str:
    """Distinct, plausible text of about `tokens` tokens (~23 per line): survey notes."""
    lines = []
    for i in range(start, start + max(1, tokens // 23)):
        animal, place = ANIMALS[i % len(ANIMALS)], PLACES[(i * 3) % len(PLACES)]
        lines.append(f"Day {i}: {1 + i % 7} {animal}s seen near {place} at {6 + i % 12}:{i % 60:02d}.")
    return "\n".join(lines)


def turns(paste_tokens: int) -> list[tuple[str, str]]:
    return [
        ("turn1_hello", "Reply with just: ready."),
        ("turn2_first_paste", "Here are my survey notes, part 1. Which animal appears most often? "
                              "Answer in one sentence.\n\n" + field_notes(0, paste_tokens)),
        ("turn3_second_paste", "Here are my survey notes, part 2. Which place appears most often? "
                               "Answer in one sentence.\n\n" + field_notes(1_000, paste_tokens)),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--paste-tokens", type=int, default=3500, help="about how many tokens each paste holds")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per turn")
    parser.add_argument("--claude-model", default="", help="--model for claude (default: its own claude-* name)")
    parser.add_argument("--claude-arg", action="append", default=[], metavar="ARG")
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR)
    parser.add_argument("--keep-output", action="store_true", help="put the CLI's raw stdout/stderr in the JSON")
    parser.add_argument("--out", type=Path, help="also write the JSON summary to this file")
    args = parser.parse_args(argv)
    args.side_traffic = False
    base = args.base_url.rstrip("/").removesuffix("/v1")
    summary: dict[str, Any] = {"base_url": base, "paste_tokens": args.paste_tokens}
    try:
        summary["server"] = check_server(base)
        binary = ensure_clis(args.cache_dir, {CLAUDE_PKG: CLAUDE_VERSION})["claude"]
    except Missing as exc:
        log(f"cannot run: {exc}")
        summary["skipped"] = str(exc)
        emit(summary, args.out)
        return 2
    (args.cache_dir / "runs").mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="compact-", dir=args.cache_dir / "runs"))
    (root / "work").mkdir()
    try:
        runs = claude_session_runs(binary, base, root / "work", root / "home", args, turns(args.paste_tokens))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary["runs"] = runs
    summary["compacted"] = any(run.get("compacted") for run in runs)
    summary["ok"] = summary["compacted"] and len(runs) == 3 and all(run["exit_code"] == 0 for run in runs)
    emit(summary, args.out)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
