"""The scripted half of a Claude-Code-shaped session, deterministic from a seed: a coding
agent's system prompt, the user's task, and one tool call with its result per later turn
(file contents, test runs, git logs, grep hits, directory listings).

Sizes are in the caller's tokens (`count_tokens`), so the benchmark sizes them with the
served model's tokenizer and a test can check them with any counter, no model needed.
The model's replies are not scripted: the benchmark adds each server's own reply.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass

CountTokens = Callable[[str], int]

# what the issue asks for: a ~1.2K-token system prompt, ~950-token tool results, 20 turns
SYSTEM_TOKENS = 1200
TOOL_RESULT_TOKENS = 950
NUM_TURNS = 20
# a sized text lands within this fraction of its target
SIZE_TOLERANCE = 0.05

NOUNS = ("parser", "tokenizer", "scheduler", "session", "config", "cache", "index", "segment", "request",
         "response", "router", "worker", "budget", "profile", "snapshot", "handler", "stream", "buffer",
         "manifest", "registry", "template", "payload", "channel", "ledger", "span", "batch")
VERBS = ("parse", "load", "build", "merge", "split", "resolve", "render", "validate", "flush", "drain",
         "encode", "decode", "collect", "schedule", "evict", "refresh", "apply", "compare", "normalize")
ADJECTIVES = ("nested", "pending", "stale", "partial", "default", "shared", "cached", "strict", "empty",
              "trailing", "leading", "unknown", "expired")
AUTHORS = ("Ada Moreno <ada@example.dev>", "Ken Ito <ken.ito@example.dev>", "Priya Nair <priya@example.dev>",
           "Jonas Berg <jberg@example.dev>", "Lea Roux <lea.roux@example.dev>")
PATTERNS = ("^[a-z_]+", "\\d+", "[A-Z][a-z]+", "^#\\s*(.*)$")
PROJECTS = ("ledgerline", "quillstack", "harborq", "tinsel-api", "copperfield", "mosaic-sync")


@dataclass(frozen=True)
class ToolTurn:
    """One tool call the agent made after a reply, and what the tool answered."""

    call_id: str
    name: str
    arguments: dict[str, object]
    result: str


@dataclass(frozen=True)
class SessionScript:
    """Everything but the model's replies: turn 1 is the system prompt and the task; turn
    k > 1 adds turn k-1's reply (with `tool_turns[k-2]`'s call) and that call's result."""

    seed: int
    system: str
    task: str
    tool_turns: tuple[ToolTurn, ...]

    @property
    def num_turns(self) -> int:
        return len(self.tool_turns) + 1


def build_session(seed: int, count_tokens: CountTokens, *, num_turns: int = NUM_TURNS,
                  system_tokens: int = SYSTEM_TOKENS, tool_result_tokens: int = TOOL_RESULT_TOKENS) -> SessionScript:
    """The session for `seed`: the same seed gives the same texts; every tool result differs."""
    if num_turns < 1:
        raise ValueError(f"num_turns must be at least 1, got {num_turns}")
    rng = random.Random(seed)
    project = rng.choice(PROJECTS)
    files = _project_files(rng)
    system = _system_prompt(rng, project, files, system_tokens, count_tokens)
    target = rng.choice(files)
    task = (f"The test suite fails since yesterday's merge: `pytest tests/` reports errors around "
            f"{target}. Find the cause, fix it with the smallest change, and run the tests again. "
            f"Explain briefly what was wrong before you change anything.")
    kinds = (_read_file, _run_tests, _grep, _git_log, _read_file, _list_directory)
    tool_turns = []
    for turn in range(2, num_turns + 1):
        turn_rng = random.Random(f"{seed}/{turn}")  # a turn's text does not depend on the others'
        make = kinds[(turn - 2 + seed) % len(kinds)]
        name, arguments, lines = make(turn_rng, project, files, turn)
        result = _fill(lines, tool_result_tokens, count_tokens, f"{name} result of turn {turn}")
        tool_turns.append(ToolTurn(f"call_{seed:x}_{turn:02d}", name, arguments, result))
    return SessionScript(seed, system, task, tuple(tool_turns))


def messages_for_turn(script: SessionScript, turn: int, replies: list[str]) -> list[dict[str, object]]:
    """Chat messages of turn `turn` (1-based), given the replies to turns 1..turn-1: each
    reply is an assistant message carrying the turn's tool call, then the call's result."""
    if not 1 <= turn <= script.num_turns or len(replies) < turn - 1:
        raise ValueError(f"turn {turn} needs {turn - 1} replies (got {len(replies)}) of {script.num_turns} turns")
    messages: list[dict[str, object]] = [{"role": "system", "content": script.system},
                                         {"role": "user", "content": script.task}]
    for reply, tool in zip(replies[: turn - 1], script.tool_turns):
        call = {"id": tool.call_id, "type": "function",
                "function": {"name": tool.name, "arguments": json.dumps(tool.arguments)}}
        messages.append({"role": "assistant", "content": reply, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": tool.call_id, "content": tool.result})
    return messages


# ---------------------------------------------------------------- sizing


def _fill(lines: list[str], target: int, count_tokens: CountTokens, what: str) -> str:
    """The run of `lines` from the start whose token count is nearest `target` (a binary
    search: a prefix never has fewer tokens than a shorter one); it must land within
    SIZE_TOLERANCE of it, so the generators make more lines than any target needs."""
    def tokens(num_lines: int) -> int:
        return count_tokens("\n".join(lines[:num_lines]))

    low, top = 0, len(lines)  # tokens(low) <= target; the longest such prefix is in [low, top]
    while low < top:
        middle = (low + top + 1) // 2
        if tokens(middle) <= target:
            low = middle
        else:
            top = middle - 1
    if low < len(lines) and tokens(low + 1) - target < target - tokens(low):
        low += 1
    text = "\n".join(lines[:low])
    if abs(count_tokens(text) - target) > target * SIZE_TOLERANCE:
        raise ValueError(f"{what}: could not size it to {target} tokens (got {count_tokens(text)})")
    return text


# ---------------------------------------------------------------- the system prompt


def _article(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def _project_files(rng: random.Random) -> list[str]:
    packages = rng.sample(("core", "api", "storage", "cli", "sync", "util"), 3)
    return [f"src/{rng.choice(packages)}/{noun}.py" for noun in rng.sample(NOUNS, 12)]


def _system_prompt(rng: random.Random, project: str, files: list[str], target: int, count_tokens: CountTokens) -> str:
    head = [
        "You are an interactive command-line agent that helps users with software engineering tasks. "
        "Use the instructions below and the tools available to you to assist the user.",
        "",
        "# Tone and style",
        "Be concise and direct. Answer in fewer than four lines unless the user asks for detail. "
        "Do not add preamble or a summary of what you did unless asked. When you run a non-trivial "
        "command, explain what it does and why you are running it.",
        "",
        "# Tools",
        "You can call these tools. Call several in one turn when they do not depend on each other.",
        "- Read(file_path, offset?, limit?): read a file; lines come back numbered, starting at 1.",
        "- Bash(command, timeout?): run a shell command in the project directory and return its output.",
        "- Grep(pattern, path?, glob?): search file contents with a regular expression.",
        "- Glob(pattern): list files whose paths match a glob pattern, newest first.",
        "- Edit(file_path, old_string, new_string): replace one exact occurrence of a string in a file.",
        "- Write(file_path, content): create or overwrite a file.",
        "",
        "# Doing tasks",
    ]
    templates = (
        "- Before you {verb} {a_noun}, read the code that owns it and follow its conventions.",
        "- When {an_adjective_lower} {noun} breaks a test, reproduce the failure first, then fix the cause, not the test.",
        "- Never {verb} {a_noun} in a way that changes public behaviour without saying so in your answer.",
        "- Prefer editing the existing {noun} module over adding a new file when you {verb} it.",
        "- If you cannot {verb} the {adjective} {noun} safely, stop and ask the user instead of guessing.",
        "- {an_adjective} {noun} is a bug report waiting to happen: check for it when you {verb} one.",
        "- Tests that {verb} {a_noun} run in CI on every push; run them locally before you say you are done.",
    )
    combos = [(t, v, n, a) for t in templates for v in VERBS for n in NOUNS for a in ADJECTIVES]
    rules = [t.format(verb=v, noun=n, adjective=a, a_noun=_article(n), an_adjective=_article(a).capitalize(),
                      an_adjective_lower=_article(a)) for t, v, n, a in rng.sample(combos, 200)]
    tail = [
        "",
        "# Git",
        "Never commit, push or rewrite history unless the user asks. Never skip hooks. Before a commit, "
        "run `git status` and `git diff` and write a message that says why, not only what.",
        "",
        "# Environment",
        f"Working directory: /home/dev/src/{project}",
        "Is directory a git repo: yes",
        "Platform: linux",
        f"Today's date: 2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
        "Files the user touched recently:",
        *[f"  {path}" for path in files],
    ]
    # the rules are the filler: as many as fit, then the fixed tail
    budget = target - count_tokens("\n".join(head + tail))
    filler = _fill(rules, budget, count_tokens, "system prompt rules") if budget > 0 else ""
    return "\n".join([*head, filler, *tail])


# ---------------------------------------------------------------- tool results


def _identifier(rng: random.Random) -> str:
    return f"{rng.choice(VERBS)}_{rng.choice(ADJECTIVES)}_{rng.choice(NOUNS)}"


def _python_lines(rng: random.Random, module: str) -> list[str]:
    """A plausible Python module: imports, a dataclass, functions with loops and errors."""
    noun = module.rsplit("/", 1)[-1].removesuffix(".py")
    cls = "".join(part.title() for part in noun.split("_"))
    lines = [f'"""{cls} handling: what the service keeps about each {noun} and how it changes."""', "",
             "from __future__ import annotations", "", "import logging", "import os", "import re",
             "from dataclasses import dataclass, field", "", "logger = logging.getLogger(__name__)",
             f"MAX_{noun.upper()}_BYTES = {rng.choice((4096, 65536, 1 << 20))}", "", "",
             "@dataclass", f"class {cls}:", f'    """One {noun} as stored; `version` grows on every change."""', "",
             "    name: str", "    version: int = 0", "    tags: list[str] = field(default_factory=list)", ""]
    for _ in range(60):
        name, other = _identifier(rng), rng.choice(NOUNS)
        arg = rng.choice(("value", "items", "text", "entries", "path"))
        lines += ["", f"def {name}({arg}: str, *, strict: bool = {rng.choice(('False', 'True'))}) -> list[str]:",
                  f'    """{name.replace("_", " ").capitalize()}: the {other} parts of `{arg}`, in order."""',
                  "    parts: list[str] = []"]
        for _ in range(rng.randint(1, 3)):
            lines += rng.choice([
                [f"    for index, item in enumerate({arg}.split({rng.choice([repr(c) for c in ',;|:'])})):",
                 "        if not item.strip() and strict:",
                 f'            raise ValueError(f"empty {other} at {{index}} in {{{arg}!r}}")',
                 "        parts.append(item.strip())"],
                [f"    match = re.match(r\"{rng.choice(PATTERNS)}\", {arg})",
                 "    if match is None:",
                 f'        logger.warning("no {other} in %r", {arg})',
                 "        return parts"],
                [f"    if len({arg}) > MAX_{noun.upper()}_BYTES:",
                 f'        raise ValueError(f"{other} too large: {{len({arg})}} bytes")'],
                [f'    root = os.environ.get("{noun.upper()}_ROOT", "/var/lib/{noun}")',
                 f"    parts.append(os.path.join(root, {arg}))"],
            ])
        lines.append(rng.choice(("    return parts", "    return sorted(set(parts))", "    return parts[::-1]")))
    return lines


def _read_file(rng: random.Random, project: str, files: list[str], turn: int) -> tuple[str, dict[str, object], list[str]]:
    path = rng.choice(files)
    offset = rng.choice((1, 1, 40, 120))
    body = _python_lines(rng, path)
    numbered = [f"{offset + i:>6}\u2192{line}" for i, line in enumerate(body[offset - 1:])]
    return "Read", {"file_path": f"/home/dev/src/{project}/{path}", "offset": offset}, numbered


def _run_tests(rng: random.Random, project: str, files: list[str], turn: int) -> tuple[str, dict[str, object], list[str]]:
    lines = ["============================= test session starts ==============================",
             f"platform linux -- Python 3.12.{rng.randint(1, 9)}, pytest-8.{rng.randint(0, 4)}.{rng.randint(0, 3)}, "
             "pluggy-1.5.0", f"rootdir: /home/dev/src/{project}", "configfile: pyproject.toml",
             f"collected {rng.randint(150, 400)} items", ""]
    failed = []
    for path in rng.sample(files, len(files)):
        test_file = "tests/test_" + path.rsplit("/", 1)[-1]
        for _ in range(rng.randint(3, 8)):
            test = f"{test_file}::test_{_identifier(rng)}"
            status = "FAILED" if rng.random() < 0.08 else "PASSED"
            if status == "FAILED":
                failed.append(test)
            lines.append(f"{test} {status} [{rng.randint(1, 99):>3}%]")
    lines += ["", "=================================== FAILURES ==================================="]
    for test in failed or [f"tests/test_{rng.choice(NOUNS)}.py::test_{_identifier(rng)}"]:
        name = test.split("::")[1]
        lines += [f"_____________________________ {name} _____________________________", "",
                  f"    def {name}():", f"        got = {_identifier(rng)}(\"{rng.choice(NOUNS)}, {rng.choice(NOUNS)}\")",
                  f"        assert got == [\"{rng.choice(NOUNS)}\"]",
                  f"E       AssertionError: assert ['{rng.choice(NOUNS)}', ''] == ['{rng.choice(NOUNS)}']", "",
                  f"{test.split('::')[0]}:{rng.randint(10, 300)}: AssertionError"]
    return "Bash", {"command": "python -m pytest tests/ -q -x --no-header -rf"}, lines


def _grep(rng: random.Random, project: str, files: list[str], turn: int) -> tuple[str, dict[str, object], list[str]]:
    word = f"{rng.choice(ADJECTIVES)}_{rng.choice(NOUNS)}"
    lines = []
    for _ in range(200):
        path = rng.choice(files)
        code = rng.choice([f"    if {word} is None:", f"def {_identifier(rng)}({word}: str) -> None:",
                           f"    {word} = {_identifier(rng)}(value)", f"        return {word}.strip()",
                           f'    logger.debug("{word}=%r", {word})', f"from .{rng.choice(NOUNS)} import {word}"])
        lines.append(f"{path}:{rng.randint(1, 900)}:{code}")
    return "Grep", {"pattern": word, "path": "src", "output_mode": "content", "-n": True}, lines


def _git_log(rng: random.Random, project: str, files: list[str], turn: int) -> tuple[str, dict[str, object], list[str]]:
    lines = []
    for _ in range(60):
        lines += [f"commit {rng.getrandbits(160):040x}", f"Author: {rng.choice(AUTHORS)}",
                  f"Date:   {rng.choice(('Mon', 'Tue', 'Wed', 'Thu', 'Fri'))} Nov {rng.randint(1, 30)} "
                  f"{rng.randint(8, 19):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d} 2026 +0100", "",
                  f"    {rng.choice(VERBS).capitalize()} the {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} "
                  f"before the {rng.choice(NOUNS)} is {rng.choice(('written', 'read', 'closed', 'sent'))}", "",
                  f" {rng.choice(files)} | {rng.randint(1, 60)} {'+' * rng.randint(1, 12)}{'-' * rng.randint(0, 6)}", ""]
    return "Bash", {"command": "git log --stat -n 30"}, lines


def _list_directory(rng: random.Random, project: str, files: list[str], turn: int) -> tuple[str, dict[str, object], list[str]]:
    lines = [f"total {rng.randint(200, 900)}"]
    for _ in range(150):
        directory = rng.random() < 0.2
        name = f"{rng.choice(ADJECTIVES)}_{rng.choice(NOUNS)}{'' if directory else rng.choice(('.py', '.toml', '.md', '.json'))}"
        lines.append(f"{'drwxr-xr-x' if directory else '-rw-r--r--'}  {rng.randint(1, 9)} dev dev "
                     f"{rng.randint(96, 48000):>6} Nov {rng.randint(1, 30):>2} {rng.randint(8, 19):02d}:"
                     f"{rng.randint(0, 59):02d} {name}")
    return "Bash", {"command": f"ls -la src/{rng.choice(('core', 'api', 'storage', 'cli', 'sync', 'util'))}"}, lines
