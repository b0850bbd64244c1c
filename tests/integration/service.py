"""Start and stop a real mlxd service (router + worker processes) for integration tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    """A running `mlxd serve` subprocess; its log lines are kept for assertions."""

    def __init__(self, args: list[str], home: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.home = home
        self.base_url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "router", "serve", "--port", str(self.port), "--home", str(home), *args]
        self.log: deque[str] = deque(maxlen=5000)
        self._lines_read = 0  # every line ever appended, kept or not
        self._log_lock = threading.Lock()
        self.proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._log_lock:
                self.log.append(line.rstrip("\n"))
                self._lines_read += 1
            if os.environ.get("MLXD_TEST_ECHO"):
                sys.stderr.write(line)

    def log_text(self) -> str:
        with self._log_lock:
            return "\n".join(self.log)

    def log_mark(self) -> int:
        """Where the log stands now, for `log_since`: on a service other modules share, a
        line a test looks for must be one its own requests wrote."""
        return self._lines_read

    def log_since(self, mark: int) -> str:
        """The log lines written after `mark` (as many of them as are still kept)."""
        with self._log_lock:
            new, kept = self._lines_read - mark, list(self.log)
        return "\n".join(kept[-new:]) if new > 0 else ""

    def wait_for_log(self, text: str, after: int = 0, timeout: float = 30.0) -> str:
        """The first line after `after` (a `log_mark`) that holds `text`, waited for: a line
        a process wrote before it answered can still be in the pipe when the answer lands."""
        deadline = time.monotonic() + timeout
        while True:
            found = [line for line in self.log_since(after).splitlines() if text in line]
            if found:
                return found[0]
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} in the log:\n" + self.log_since(after)[-4000:])
            time.sleep(0.05)

    def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlxd exited with {self.proc.returncode}:\n{self.log_text()[-4000:]}")
            try:
                health = httpx.get(f"{self.base_url}/health", timeout=2).json()
                workers = health.get("workers", {})
                if (health.get("status") != "starting" and workers
                        and all(w.get("state") == "ready" for w in workers.values())):
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.3)
        raise TimeoutError(f"mlxd not ready after {timeout}s:\n{self.log_text()[-4000:]}")

    def health(self) -> dict:
        return httpx.get(f"{self.base_url}/health", timeout=5).json()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@contextmanager
def running_service(args: list[str], home: Path, env: dict[str, str] | None = None,
                    ready_timeout: float = 300.0) -> Iterator[Service]:
    """A Service started with `args` and ready, stopped on the way out."""
    svc = Service(args, home=home, env=env)
    try:
        svc.wait_ready(timeout=ready_timeout)
        yield svc
    finally:
        svc.stop()


def kv_block_bytes(model_dir: Path, block_tokens: int) -> int:
    """A worker's hot-tier size of one block of this model: K and V of every layer, float32
    on a CPU (tests size a small hot tier in blocks with it)."""
    config = json.loads((model_dir / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * head_dim * 4 * block_tokens
