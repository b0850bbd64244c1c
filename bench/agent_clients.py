"""Run the real Claude Code and Codex CLIs against a running mlxd (opt-in smoke benchmark).

The CLIs come from npm (`@anthropic-ai/claude-code`, `@openai/codex`, pinned versions) and
are installed into `.cache/agents` on first use. Each run gets a fresh working directory
holding `hello.txt` with a known sentence, and a throwaway HOME / CODEX_HOME, so nothing
global is read or written. The CLIs are given only the base URL, a dummy key (Claude Code
refuses to start without one; Codex needs none for a custom provider) and the model name:

  claude: ANTHROPIC_BASE_URL=<base> ANTHROPIC_API_KEY=dummy HOME=<tmp>
          claude -p --input-format stream-json --output-format stream-json --verbose
          (both turns in one session: the user messages go in on stdin, the second after
          the first turn's result; `--claude-continue` runs turn 2 as `claude -p "<prompt>"
          --continue` instead)
  codex:  HOME=<tmp> CODEX_HOME=<tmp>/.codex (the directory must exist)
          codex exec --skip-git-repo-check --json -m <id> -c model_provider=mlxd
                -c 'model_providers.mlxd={name="mlxd",base_url="<base>/v1",wire_api="responses"}'
          (second turn: `codex exec resume --last ...`)

By default the CLIs' own side traffic is switched off too, so that nothing goes anywhere but
the base URL: CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 (Claude Code's telemetry to
api.anthropic.com and its parallel session-title request) and `-c analytics.enabled=false
-c features.plugins=false` (Codex's analytics to ab.chatgpt.com and its plugin sync with
github.com / chatgpt.com). `--side-traffic` leaves the CLIs' defaults (the calls out fail
offline; the title request then reaches mlxd as well: a json_schema structured output). `--fake` runs everything against a built-in scripted server
instead of mlxd and lists the requests it received: a check of this script and a view of
the request flow. Transcripts go to stderr, one JSON summary to stdout (and `--out`).
Exit code: 0 when every CLI run exited 0, 1 otherwise, 2 when the CLIs or the server
cannot be reached (0 with `--skip-missing`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
CACHE_DIR = REPO / ".cache" / "agents"
CLAUDE_PKG = "@anthropic-ai/claude-code"
CODEX_PKG = "@openai/codex"
OPENCODE_PKG = "opencode-ai"
# Pinned so runs are comparable; override with --claude-version / --codex-version.
CLAUDE_VERSION = "2.1.197"
CODEX_VERSION = "0.171.0"
SECRET = "amber-falcon-7342"
SENTENCE = f"The launch code is {SECRET}."
PROMPTS = {
    # Claude Code's Read tool takes an absolute path; small models otherwise pick a path out of
    # its system prompt (the memory directory), so the user names the file as a user would
    "claude_turn1": "Use your Read tool to read {hello}, then tell me what it says.",
    "claude_turn2": "Repeat the launch code from hello.txt once more, exactly.",
    "codex_turn1": "What is in hello.txt?",
    "codex_turn2": "Repeat the launch code from hello.txt once more, exactly.",
}


class Missing(Exception):
    """npm, a CLI or the server is not reachable: the run cannot happen here."""


def log(message: str) -> None:
    sys.stderr.write(f"{time.strftime('%H:%M:%S')} agent_clients: {message}\n")
    sys.stderr.flush()


# --------------------------------------------------------------------------- install


def _package_version(prefix: Path, pkg: str) -> str | None:
    try:
        return json.loads((prefix / "node_modules" / pkg / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


def _cli_version(binary: Path) -> str | None:
    try:
        done = subprocess.run([str(binary), "--version"], check=False, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def ensure_clis(prefix: Path, wanted: dict[str, str]) -> dict[str, Path]:
    """Install the pinned CLIs into prefix unless they are there; return their binaries."""
    stale = [f"{pkg}@{ver}" for pkg, ver in wanted.items() if _package_version(prefix, pkg) != ver]
    if stale:
        npm = shutil.which("npm")
        if not npm:
            raise Missing("npm is not on PATH; install Node.js >= 18 with npm to run the agent CLIs")
        prefix.mkdir(parents=True, exist_ok=True)
        log(f"npm install --prefix {prefix} {' '.join(stale)}")
        done = subprocess.run(check=False, args=[npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", *stale],
                              capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise Missing(f"npm install failed ({done.returncode}): {done.stderr.strip()[-1500:]}")
    clis = {"claude": CLAUDE_PKG, "codex": CODEX_PKG, "opencode": OPENCODE_PKG}
    bins = {name: prefix / "node_modules" / ".bin" / name for name in clis}
    for name, script in (("claude", "install.cjs"), ("opencode", "postinstall.mjs")):
        if clis[name] in wanted and not _cli_version(bins[name]):
            # the bin is a placeholder until the package's install script copies the native
            # binary in; npm setups that skip install scripts leave the placeholder: run it by hand.
            subprocess.run(["node", script], check=False, cwd=prefix / "node_modules" / clis[name],
                           capture_output=True, timeout=300, stdin=subprocess.DEVNULL)
    for name, pkg in clis.items():
        if pkg in wanted and not _cli_version(bins[name]):
            raise Missing(f"{bins[name]} does not run (`--version` failed); reinstall with "
                          f"`rm -rf {prefix}` and run again")
    return bins


# --------------------------------------------------------------------------- fake server


class FakeServer:
    """A scripted stand-in for mlxd: /v1/messages (Anthropic) and /v1/responses (OpenAI).

    First call of a conversation asks for the file (Claude: Read tool_use; Codex:
    exec_command `cat hello.txt`); once a tool result is in the history it answers with
    it. Streams when asked. Every request is recorded in `requests`.
    """

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def handle_any(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                server.record(self.command, self.path, dict(self.headers), body, len(raw))
                path = self.path.split("?")[0]
                if self.command == "HEAD":  # Claude Code (Bun) sends HEAD / to the base URL at start
                    self.send_response(200)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return None
                if self.command == "POST" and path.endswith("/messages"):
                    return self.reply(*server.messages(body or {}))
                if self.command == "POST" and path.endswith("/responses"):
                    return self.reply(*server.responses(body or {}))
                if path.endswith("/models"):
                    return self.reply(False, [], {"object": "list", "data": [{"id": "fake", "object": "model"}]})
                self.reply(False, [], {"error": {"message": f"no route {path}"}}, 404)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = handle_any

            def reply(self, stream: bool, events: list[tuple[str, dict]], whole: dict, code: int = 200) -> None:
                if not stream:
                    data = json.dumps(whole).encode()
                    self.send_response(code)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                for name, data in events:
                    self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()
                self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def record(self, method: str, path: str, headers: dict[str, str], body: Any, size: int) -> None:
        low = {k.lower(): v for k, v in headers.items()}
        entry: dict[str, Any] = {"method": method, "path": path, "bytes": size,
                                 "user_agent": low.get("user-agent"),
                                 "auth": "x-api-key" if "x-api-key" in low else
                                 "bearer" if "authorization" in low else None}
        for key in ("anthropic-version", "anthropic-beta", "accept"):
            if key in low:
                entry[key] = low[key]
        if isinstance(body, dict):
            turns = body.get("messages") or body.get("input") or []
            entry.update({
                "model": body.get("model"), "stream": body.get("stream"),
                "max_tokens": body.get("max_tokens") or body.get("max_output_tokens"),
                "items": [t.get("role") or t.get("type") for t in turns if isinstance(t, dict)],
                "tools": len(body.get("tools") or []),
                "other_keys": sorted(set(body) - {"model", "stream", "messages", "input", "tools", "system",
                                                  "instructions", "max_tokens", "metadata", "client_metadata"}),
            })
        self.requests.append(entry)

    # Anthropic Messages
    def messages(self, body: dict) -> tuple[bool, list, dict]:
        n = next(self._ids)
        history = json.dumps(body.get("messages") or [])
        results = []
        for message in body.get("messages") or []:
            for block in message.get("content") if isinstance(message.get("content"), list) else []:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    got = block.get("content")
                    results.append(got if isinstance(got, str) else
                                   " ".join(b.get("text", "") for b in got or [] if isinstance(b, dict)))
        tools = [t.get("name") for t in body.get("tools") or []]
        if results:
            content = [{"type": "text", "text": "The file contains: " + results[-1]}]
        elif "Read" in tools:
            found = re.search(r"working directory: (/[^\s\\\"]+)", json.dumps(body.get("system")) + history)
            path = (found.group(1) if found else ".") + "/hello.txt"
            content = [{"type": "tool_use", "id": f"toolu_{n}", "name": "Read", "input": {"file_path": path}}]
        else:
            content = [{"type": "text", "text": "Hello from the fake server."}]
        stop = "tool_use" if content[0]["type"] == "tool_use" else "end_turn"
        whole = {"id": f"msg_{n}", "type": "message", "role": "assistant", "model": body.get("model"),
                 "content": content, "stop_reason": stop, "stop_sequence": None,
                 "usage": {"input_tokens": 1, "output_tokens": 1}}
        block = content[0]
        if block["type"] == "text":
            start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
        else:
            start = dict(block, input={})
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events = [
            ("message_start", {"type": "message_start", "message": dict(whole, content=[], stop_reason=None)}),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                               "usage": {"output_tokens": 1}}),
            ("message_stop", {"type": "message_stop"}),
        ]
        return bool(body.get("stream")), events, whole

    # OpenAI Responses
    def responses(self, body: dict) -> tuple[bool, list, dict]:
        n = next(self._ids)
        items = [i for i in body.get("input") or [] if isinstance(i, dict)]
        outputs = [i.get("output") for i in items if i.get("type") == "function_call_output"]
        tools = [t.get("name") for t in body.get("tools") or []]
        if outputs:
            text = outputs[-1] if isinstance(outputs[-1], str) else json.dumps(outputs[-1])
            item = {"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": "The file contains: " + text, "annotations": []}]}
        elif "exec_command" in tools:
            item = {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}", "status": "completed",
                    "name": "exec_command", "arguments": json.dumps({"cmd": "cat hello.txt"})}
        else:
            item = {"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": "Hello from the fake server.", "annotations": []}]}
        whole = {"id": f"resp_{n}", "object": "response", "created_at": int(time.time()), "status": "completed",
                 "model": body.get("model"), "output": [item],
                 "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2,
                           "input_tokens_details": {"cached_tokens": 0},
                           "output_tokens_details": {"reasoning_tokens": 0}}}
        if item["type"] == "message":
            added = dict(item, status="in_progress", content=[])
            delta = ("response.output_text.delta", {"type": "response.output_text.delta", "output_index": 0,
                     "item_id": item["id"], "content_index": 0, "delta": item["content"][0]["text"]})
        else:
            added = dict(item, status="in_progress", arguments="")
            delta = ("response.function_call_arguments.delta", {"type": "response.function_call_arguments.delta",
                     "output_index": 0, "item_id": item["id"], "delta": item["arguments"]})
        events = [
            ("response.created", {"type": "response.created",
                                  "response": dict(whole, status="in_progress", output=[])}),
            ("response.output_item.added", {"type": "response.output_item.added", "output_index": 0,
                                            "item": added}),
            delta,
            ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": item}),
            ("response.completed", {"type": "response.completed", "response": whole}),
        ]
        return bool(body.get("stream")), events, whole


# --------------------------------------------------------------------------- runs


def check_server(base: str) -> dict[str, Any]:
    """Is anything answering at base? (Any HTTP answer counts; /v1/models is informational.)"""
    try:
        answer = httpx.get(f"{base}/v1/models", timeout=10)
    except httpx.HTTPError as exc:
        raise Missing(f"no server at {base} ({type(exc).__name__}: {exc}); start mlxd first") from exc
    info: dict[str, Any] = {"v1_models_status": answer.status_code}
    try:
        info["v1_models_ids"] = [m.get("id") for m in answer.json().get("data", [])]
    except (ValueError, AttributeError):
        pass
    return info


def base_env(home: Path) -> dict[str, str]:
    """A clean environment: nothing of the caller's ANTHROPIC_*/OPENAI_*/proxy settings."""
    node_dir = str(Path(shutil.which("node") or "/usr/bin/node").parent)
    path = os.pathsep.join(dict.fromkeys([node_dir, "/usr/local/bin", "/usr/bin", "/bin"]))
    return {"PATH": path, "HOME": str(home), "LANG": os.environ.get("LANG", "C.UTF-8"), "TERM": "dumb",
            "NO_COLOR": "1"}


def run_cli(name: str, cmd: list[str], env: dict[str, str], cwd: Path, timeout: float,
            shown_env: dict[str, str]) -> dict[str, Any]:
    """Run one CLI invocation in its own process group; kill the group on timeout."""
    log(f"{name}: {' '.join(cmd)}")
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    return {"name": name, "cmd": cmd, "env": shown_env, "cwd": str(cwd), "exit_code": proc.returncode,
            "timed_out": timed_out, "duration_s": round(time.perf_counter() - started, 2),
            "stdout": out, "stderr": err}


def parse_claude(run: dict[str, Any]) -> list[str]:
    """Fill answer/tools/usage from `--output-format stream-json`; return transcript lines."""
    lines, tools, answer = [], [], None
    for raw in run["stdout"].splitlines():
        try:
            event = json.loads(raw)
        except ValueError:
            lines.append(f"  (non-JSON) {raw}")
            continue
        kind = event.get("type")
        if kind == "system" and event.get("subtype") == "compact_boundary":
            run["compacted"] = True
            lines.append(f"  [compact_boundary] {json.dumps(event.get('compact_metadata'))}")
        elif kind == "system" and event.get("subtype") not in (None, "init"):
            lines.append(f"  [system {event.get('subtype')}] {json.dumps(event)[:300]}")
        elif kind == "system" and event.get("subtype") == "init":
            run["session_id"] = event.get("session_id")
            lines.append(f"  [init] model={event.get('model')} tools={len(event.get('tools') or [])} "
                         f"permissionMode={event.get('permissionMode')}")
        elif kind in ("assistant", "user"):
            for block in (event.get("message") or {}).get("content") or []:
                if not isinstance(block, dict):
                    continue
                if block.get("type") == "text":
                    lines.append(f"  [{kind}] {block.get('text')}")
                elif block.get("type") == "tool_use":
                    tools.append(block.get("name"))
                    lines.append(f"  [tool_use] {block.get('name')} {json.dumps(block.get('input'))}")
                elif block.get("type") == "tool_result":
                    content = block.get("content")
                    text = content if isinstance(content, str) else json.dumps(content)
                    lines.append(f"  [tool_result{' ERROR' if block.get('is_error') else ''}] {text[:500]}")
        elif kind == "result":
            answer = event.get("result")
            run.update({"result_subtype": event.get("subtype"), "is_error": event.get("is_error"),
                        "num_turns": event.get("num_turns"), "usage": event.get("usage"),
                        "api_error_status": event.get("api_error_status"),
                        "permission_denials": event.get("permission_denials"),
                        "cli_duration_ms": event.get("duration_ms"), "ttft_ms": event.get("ttft_ms")})
            lines.append(f"  [result {event.get('subtype')}] {answer}")
    run["answer"], run["tools"] = answer, tools
    return lines


def parse_codex(run: dict[str, Any], last_message: Path) -> list[str]:
    """Fill answer/tools/usage from `codex exec --json`; return transcript lines."""
    lines, tools, answer, errors = [], [], None, []
    for raw in run["stdout"].splitlines():
        try:
            event = json.loads(raw)
        except ValueError:
            lines.append(f"  (non-JSON) {raw}")
            continue
        kind, item = event.get("type"), event.get("item") or {}
        if kind == "thread.started":
            run["thread_id"] = event.get("thread_id")
        elif kind == "item.completed":
            itype = item.get("type")
            if itype == "agent_message":
                answer = item.get("text")
                lines.append(f"  [agent_message] {answer}")
            elif itype == "command_execution":
                tools.append("command_execution")
                lines.append(f"  [exec exit={item.get('exit_code')}] {item.get('command')}\n"
                             f"      {str(item.get('aggregated_output'))[:500]}")
            elif itype == "error":
                errors.append(item.get("message"))
                lines.append(f"  [error] {item.get('message')}")
            else:
                tools.append(itype)
                lines.append(f"  [{itype}] {json.dumps(item)[:300]}")
        elif kind == "turn.completed":
            run["usage"] = event.get("usage")
            lines.append(f"  [turn.completed] usage={json.dumps(event.get('usage'))}")
        elif kind in ("turn.failed", "error"):
            errors.append(event.get("error") or event.get("message"))
            lines.append(f"  [{kind}] {json.dumps(event)[:500]}")
    if last_message.exists() and not answer:
        answer = last_message.read_text().strip() or None
    run["answer"], run["tools"], run["errors"] = answer, tools, errors
    return lines


def finish(run: dict[str, Any], transcript: list[str], keep_output: bool) -> dict[str, Any]:
    run["sentence_in_answer"] = bool(run.get("answer")) and SECRET.lower() in run["answer"].lower()
    sys.stderr.write(f"\n===== {run['name']} (exit {run['exit_code']}, {run['duration_s']} s"
                     f"{', TIMED OUT' if run['timed_out'] else ''}) =====\n")
    sys.stderr.write("\n".join(transcript) + "\n")
    err_tail = [line for line in run["stderr"].splitlines() if line.strip()][-15:]
    if err_tail:
        sys.stderr.write("  --- stderr (tail) ---\n" + "\n".join(f"  {line}" for line in err_tail) + "\n")
    run["stderr_tail"] = "\n".join(err_tail)
    if not keep_output:
        run.pop("stdout"), run.pop("stderr")
    return run


def claude_runs(binary: Path, base: str, model: str, work: Path, home: Path, args: argparse.Namespace) -> list[dict]:
    shown = {"ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": "dummy", "HOME": str(home)}
    if not args.side_traffic:
        shown["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] = "1"
    env = {**base_env(home), **shown}
    # no --model by default: Claude Code asks for its own name (claude-*), which mlxd's
    # default model_aliases sends to the service's default model: the base URL is the only setting
    chosen = ["--model", args.claude_model] if args.claude_model else []
    common = [*chosen, "--output-format", "stream-json", "--verbose", *args.claude_arg]
    runs = []
    for name, extra in (("claude_turn1", []), ("claude_turn2", ["--continue"])):
        cmd = [str(binary), "-p", PROMPTS[name].format(hello=work / "hello.txt"), *extra, *common]
        run = run_cli(name, cmd, env, work, args.timeout, shown)
        runs.append(finish(run, parse_claude(run), args.keep_output))
        if run["exit_code"] != 0:
            break
    return runs


def _event_type(line: str) -> str | None:
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event.get("type") if isinstance(event, dict) else None


def claude_session_runs(binary: Path, base: str, work: Path, home: Path, args: argparse.Namespace,
                        turns: list[tuple[str, str]] | None = None) -> list[dict]:
    """Both Claude Code turns in one process, as an interactive session has them: `claude -p
    --input-format stream-json` reads the user's messages from stdin; the second goes in
    once the first turn's `result` is out. (A `--continue` run is a new process, and Claude
    Code changes its system prompt between a session and its continuation: the model ID
    line loses its `[1m]`, ~770 tokens in, so turn 2 would miss the cache from there.)"""
    shown = {"ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": "dummy", "HOME": str(home)}
    if not args.side_traffic:
        shown["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] = "1"
    env = {**base_env(home), **shown}
    chosen = ["--model", args.claude_model] if args.claude_model else []
    cmd = [str(binary), "-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose",
           *chosen, *args.claude_arg]
    log(f"claude session: {' '.join(cmd)}")
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    errors: list[str] = []
    drain = threading.Thread(target=lambda: errors.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    drain.start()
    lines: queue.Queue[str | None] = queue.Queue()

    def read_stdout() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read_stdout, daemon=True).start()
    runs = []
    default_turns = [(name, PROMPTS[name].format(hello=work / "hello.txt")) for name in ("claude_turn1", "claude_turn2")]
    for name, prompt in turns or default_turns:
        message = {"type": "user", "message": {"role": "user", "content": [{"type": "text", "text": prompt}]}}
        log(f"{name}: {prompt[:200]!r}{' ...' if len(prompt) > 200 else ''}")
        proc.stdin.write(json.dumps(message) + "\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
        started, out, timed_out, ended = time.perf_counter(), [], False, False
        while True:
            try:
                line = lines.get(timeout=max(0.0, args.timeout - (time.perf_counter() - started)))
            except queue.Empty:
                timed_out = True
                break
            if line is None:
                ended = True
                break
            out.append(line)
            if _event_type(line) == "result":
                break
        run = {"name": name, "cmd": cmd, "env": shown, "cwd": str(work), "exit_code": 0 if not (timed_out or ended)
               else proc.poll(), "timed_out": timed_out, "duration_s": round(time.perf_counter() - started, 2),
               "stdout": "".join(out), "stderr": ""}
        transcript = parse_claude(run)
        if run.get("is_error") and run["exit_code"] == 0:
            run["exit_code"] = 1
        if timed_out or ended:
            run["exit_code"] = run["exit_code"] if run["exit_code"] not in (None, 0) else 1
        runs.append((run, transcript))
        if run["exit_code"] != 0:
            break
    proc.stdin.close()  # type: ignore[union-attr]
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    drain.join(timeout=5)
    runs[-1][0]["stderr"] = "".join(errors)
    return [finish(run, transcript, args.keep_output) for run, transcript in runs]


def codex_runs(binary: Path, base: str, model: str, work: Path, home: Path, args: argparse.Namespace) -> list[dict]:
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)  # codex exits 1 if CODEX_HOME does not exist
    shown = {"HOME": str(home), "CODEX_HOME": str(codex_home)}
    env = {**base_env(home), **shown}
    provider = f'model_providers.mlxd={{name="mlxd",base_url="{base}/v1",wire_api="responses"}}'
    config = ["-m", model, "-c", "model_provider=mlxd", "-c", provider]
    if not args.side_traffic:
        config += ["-c", "analytics.enabled=false", "-c", "features.plugins=false"]
    runs = []
    for name in ("codex_turn1", "codex_turn2"):
        last = work / f".{name}.last.txt"
        flags = ["--skip-git-repo-check", "--json", "-o", str(last), *config, *args.codex_arg]
        head = [str(binary), "exec"] if name == "codex_turn1" else [str(binary), "exec", "resume", "--last"]
        cmd = [*head, *flags, PROMPTS[name]]
        run = run_cli(name, cmd, env, work, args.timeout, shown)
        runs.append(finish(run, parse_codex(run, last), args.keep_output))
        if run["exit_code"] != 0:
            break
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000",
                        help="mlxd root URL (a trailing /v1 is dropped); default %(default)s")
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="model id Codex requests by name")
    parser.add_argument("--claude-model", default="",
                        help="model name Claude Code asks for (default: none given, so its own claude-* name, "
                             "which mlxd's default model_aliases maps to the service's default model)")
    parser.add_argument("--claude-continue", action="store_true",
                        help="Claude Code's turn 2 as a second process with --continue (default: both turns in "
                             "one --input-format stream-json session, as an interactive session has them)")
    parser.add_argument("--only", action="append", choices=["claude", "codex"], help="run only this CLI; repeatable")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per CLI invocation")
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR, help="npm prefix for the CLIs")
    parser.add_argument("--claude-version", default=CLAUDE_VERSION)
    parser.add_argument("--codex-version", default=CODEX_VERSION)
    parser.add_argument("--side-traffic", action="store_true",
                        help="leave the CLIs' telemetry/side requests on (see module doc)")
    parser.add_argument("--claude-arg", action="append", default=[], metavar="ARG",
                        help="extra argument for claude, e.g. --claude-arg=--allowedTools=Read; repeatable")
    parser.add_argument("--codex-arg", action="append", default=[], metavar="ARG",
                        help="extra argument for codex exec, e.g. --codex-arg=--sandbox=danger-full-access")
    parser.add_argument("--fake", action="store_true",
                        help="run against a built-in scripted server instead of --base-url; lists its requests")
    parser.add_argument("--skip-missing", action="store_true",
                        help="exit 0 (with a message) when npm, the CLIs or the server are unreachable")
    parser.add_argument("--keep", action="store_true", help="keep the temporary working dir and homes")
    parser.add_argument("--keep-output", action="store_true", help="put the CLIs' raw stdout/stderr in the JSON")
    parser.add_argument("--out", type=Path, help="also write the JSON summary to this file")
    args = parser.parse_args(argv)
    selected = args.only or ["claude", "codex"]
    base = re.sub(r"/v1/?$", "", args.base_url.rstrip("/"))
    summary: dict[str, Any] = {"model": args.model, "sentence": SENTENCE, "fake_server": args.fake}
    fake = None
    try:
        wanted = {pkg: ver for cli, pkg, ver in (("claude", CLAUDE_PKG, args.claude_version),
                                                  ("codex", CODEX_PKG, args.codex_version)) if cli in selected}
        if args.fake:
            fake = FakeServer()
            base = fake.url
        summary["base_url"] = base
        summary["server"] = check_server(base)  # before the (large, ~650 MB) install
        bins = ensure_clis(args.cache_dir, wanted)
        summary["cli_versions"] = {cli: _cli_version(bins[cli]) for cli in selected}
        summary["npm_packages"] = {pkg: _package_version(args.cache_dir, pkg) for pkg in wanted}
        summary["node"] = subprocess.run(["node", "--version"], check=False, capture_output=True, text=True).stdout.strip()
    except Missing as exc:
        if fake:
            fake.close()
        log(f"cannot run: {exc}")
        summary["skipped"] = str(exc)
        emit(summary, args.out)
        return 0 if args.skip_missing else 2
    runs_root = args.cache_dir / "runs"
    runs_root.mkdir(parents=True, exist_ok=True)
    # Under the cache, not /tmp: codex refuses to set up its helper binaries under /tmp (a warning).
    root = Path(tempfile.mkdtemp(prefix="run-", dir=runs_root))
    work = root / "work"
    work.mkdir()
    (work / "hello.txt").write_text(SENTENCE + "\n")
    summary["workdir"] = str(work)
    runs: list[dict[str, Any]] = []
    try:
        if "claude" in selected and args.claude_continue:
            runs += claude_runs(bins["claude"], base, args.model, work, root / "claude-home", args)
        elif "claude" in selected:
            runs += claude_session_runs(bins["claude"], base, work, root / "claude-home", args)
        if "codex" in selected:
            runs += codex_runs(bins["codex"], base, args.model, work, root / "codex-home", args)
    finally:
        if fake:
            fake.close()
            summary["fake_requests"] = fake.requests
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    summary["runs"] = runs
    summary["ok"] = all(r["exit_code"] == 0 for r in runs)
    summary["all_answers_have_sentence"] = all(r["sentence_in_answer"] for r in runs)
    emit(summary, args.out)
    return 0 if summary["ok"] else 1


def emit(result: dict[str, Any], out: Path | None) -> None:
    text = json.dumps(result, indent=2)
    sys.stdout.write(text + "\n")
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
