"""`mlxd launch` with the real Claude Code, Codex and OpenCode (npm, pinned; installed into
.cache/launch-agents on first use) against the real service on Qwen2.5-Coder-0.5B: the first
launch starts the service itself; each client then completes one short non-interactive turn
on the model unloaded just before it started, so its first request loads it.

One service for the module. Claude Code's first request is ~11.5K tokens (about two minutes
of prefill here), Codex's and OpenCode's a few thousand; the three prompts share no prefix,
so each is prefilled once.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from bench.agent_clients import CLAUDE_PKG, CODEX_PKG, OPENCODE_PKG, Missing, ensure_clis
from router.cli.launch_clients import CLAUDE_ALIAS
from tests.integration.service import REPO, free_port

pytestmark = pytest.mark.timeout(3600)

PINS = {CLAUDE_PKG: "2.1.332", CODEX_PKG: "0.171.0", OPENCODE_PKG: "1.18.33"}
AGENTS = Path(os.environ.get("MLXD_TEST_AGENTS", REPO / ".cache" / "launch-agents"))
MODEL = "qwen2.5-coder-0.5b"  # its 32K window holds Claude Code's ~11.5K-token prompt (SmolLM2's 8K does not)
WINDOW = 32768
CLIENT_TIMEOUT_S = 1800


@pytest.fixture(scope="module")
def clients() -> dict[str, Path]:
    try:
        return ensure_clis(AGENTS, PINS)
    except Missing as exc:
        if shutil.which("npm") is None:
            pytest.skip(f"the agent CLIs come from npm, which is not installed: {exc}")
        raise


@dataclass
class Launched:
    home: Path
    work: Path
    url: str

    def command(self, client: str, binary: Path, *args: str) -> list[str]:
        return [sys.executable, "-m", "router", "launch", client, "--home", str(self.home),
                "--client-path", str(binary), "--", *args]

    def env(self, user_home: Path) -> dict[str, str]:
        """A clean environment: the user's HOME is a throwaway, nothing of the caller's keys."""
        user_home.mkdir(exist_ok=True)
        node = str(Path(shutil.which("node") or "/usr/bin/node").parent)
        return {"PATH": os.pathsep.join(dict.fromkeys([node, "/usr/local/bin", "/usr/bin", "/bin"])),
                "HOME": str(user_home), "LANG": os.environ.get("LANG", "C.UTF-8"), "TERM": "dumb", "NO_COLOR": "1",
                "PYTHONPATH": str(REPO), "MLXD_HOME": str(self.home)}

    def state(self) -> str:
        return httpx.get(f"{self.url}/v1/models/{MODEL}", timeout=30).json()["state"]

    def unload(self) -> None:
        """The model a client will use is not loaded when the client starts."""
        answer = httpx.post(f"{self.url}/admin/models/{MODEL}/unload", timeout=120)
        assert answer.status_code == 200, answer.text
        assert self.state() == "unloaded"

    def run(self, client: str, binary: Path, *args: str) -> subprocess.CompletedProcess[str]:
        self.unload()
        done = subprocess.run(self.command(client, binary, *args), cwd=self.work, env=self.env(self.home / f"{client}-user"),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S)
        if os.environ.get("MLXD_TEST_ECHO"):
            sys.stderr.write(f"--- {client} stdout\n{done.stdout}\n--- {client} stderr\n{done.stderr}\n")
        assert self.state() != "unloaded"  # the client's own request loaded it
        return done


def _stop(pid: int) -> None:
    try:
        process = psutil.Process(pid)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    except psutil.NoSuchProcess:
        return
    except psutil.TimeoutExpired:
        os.killpg(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def launched(qwen_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launched]:
    """The first launch finds no service for its home and starts one, detached, serving `MODEL`."""
    root = tmp_path_factory.mktemp("launch")
    home, work = root / "home", root / "project"
    work.mkdir()
    # The clients' turns here test launch's plumbing, not the model's choices: under Claude
    # Code's tools the 0.5B answers "Say hello." with a bare call object, which the lazy call
    # grammar holds valid, so the one-turn run would end at its turn limit running a tool.
    home.mkdir()
    (home / "config.toml").write_text(f'[models."{MODEL}"]\ntool_call_grammar = false\n')
    port = free_port()
    setup = Launched(home, work, f"http://127.0.0.1:{port}")
    command = [sys.executable, "-m", "router", "launch", "claude", "--print", "--home", str(home), "--port", str(port),
               "--model-dir", str(qwen_model_dir.parent), "--model", MODEL]
    done = subprocess.run(command, cwd=work, env=setup.env(root / "user"), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=1200)
    service = json.loads((home / "service.json").read_text()) if (home / "service.json").exists() else None
    try:
        assert done.returncode == 0, done.stderr
        assert "no service serves home" in done.stderr and "service ready on" in done.stderr
        assert service is not None and service["port"] == port
        # --print: the settings on stdout, nothing run
        assert f"model {CLAUDE_ALIAS} (served by {MODEL}, window {WINDOW}, output cap 4096)" in done.stdout
        assert f"CLAUDE_CODE_MAX_CONTEXT_TOKENS={WINDOW}" in done.stdout
        assert (home / "logs" / "router.log").exists()  # the started service logs to the home's files
        yield setup
    finally:
        if service is not None:
            _stop(service["pid"])


def test_claude_code_completes_a_turn(launched: Launched, clients: dict[str, Path]) -> None:
    done = launched.run("claude", clients["claude"], "-p", "Say hello.", "--max-turns", "1", "--output-format", "json")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["subtype"] == "success" and not result["is_error"] and result["result"].strip()
    # it believed the window launch gave it (not the 1M it assumes for a model it does not know)
    assert result["modelUsage"][CLAUDE_ALIAS]["contextWindow"] == WINDOW
    assert "mlxd launch:   CLAUDE_CODE_ATTRIBUTION_HEADER=0" in done.stderr


def test_codex_completes_a_turn(launched: Launched, clients: dict[str, Path]) -> None:
    done = launched.run("codex", clients["codex"], "exec", "--skip-git-repo-check", "Say hello")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip()  # codex exec prints the last message on stdout
    assert f"-c model_context_window={WINDOW}" in done.stderr


def test_opencode_completes_a_turn(launched: Launched, clients: dict[str, Path]) -> None:
    """OpenCode sends its title request and the turn at once: both wait for the load."""
    done = launched.run("opencode", clients["opencode"], "run", "Say hello")
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert done.stdout.strip()
