"""--log-level reaches every process and filters their lines as the router's own: at debug
the worker's debug lines show, at warning no child's info line does."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from router.children.child_process import line_level
from tests.integration.service import Service

pytestmark = pytest.mark.timeout(300)


def child_lines(level: str, default_model_dir: Path, home: Path) -> list[str]:
    svc = Service(["--model", str(default_model_dir), "--log-level", level], home=home)
    try:
        svc.wait_ready()
        model = httpx.get(f"{svc.base_url}/v1/models").json()["data"][0]["id"]
        reply = httpx.post(f"{svc.base_url}/v1/chat/completions", timeout=120, json={
            "model": model, "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]})
        assert reply.status_code == 200
    finally:
        svc.stop()
    return [line for line in svc.log_text().splitlines() if is_child_line(line)]


def is_child_line(line: str) -> bool:
    """A child's log line, which reaches the router's stderr as the child wrote it:
    `date time LEVEL role logger: message`, the role `worker[...]` or `kvstore`."""
    parts = line.split(" ", 4)
    return len(parts) == 5 and (parts[3] == "kvstore" or parts[3].startswith("worker["))


def test_debug_reaches_the_worker(default_model_dir: Path, tmp_path: Path) -> None:
    lines = child_lines("debug", default_model_dir, tmp_path / "home")
    assert any(" DEBUG worker[" in line and "received" in line for line in lines), lines[:20]


def test_warning_hides_the_childrens_info_lines(default_model_dir: Path, tmp_path: Path) -> None:
    lines = child_lines("warning", default_model_dir, tmp_path / "home")
    assert not [line for line in lines if " INFO " in line], lines[:5]


@pytest.mark.parametrize("line, level", [
    ("2026-11-30 21:33:21,123 INFO worker[m#1] worker.engine: request done", 20),
    ("2026-11-30 21:33:21,123 ERROR kvstore kvstore.main: writer thread died", 40),
    ('{"ts": "2026-11-30T21:33:21.123+01:00", "level": "DEBUG", "role": "kvstore", "logger": "k", "msg": "m"}', 10),
    ("Traceback (most recent call last):", 30),
    ('  File "x.py", line 3, in f', 30),
])
def test_child_lines_keep_their_level(line: str, level: int) -> None:
    assert line_level(line) == level
