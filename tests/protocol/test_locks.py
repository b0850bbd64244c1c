"""protocol.locks: one holder at a time across processes, named in a refusal, and never
a stale lock after the holder dies, however it dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from protocol.locks import LockHeld, try_lock

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(60)

HOLDER = """
import subprocess, sys, time
from protocol.locks import try_lock
lock = try_lock(sys.argv[1])
if sys.argv[2] == "child":  # a child that outlives us must not keep our lock
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], close_fds=False)
    print(child.pid, flush=True)
print("locked", flush=True)
if sys.argv[2] == "exit":
    sys.exit(0)
time.sleep(60)
"""


def _hold(path: Path, mode: str = "sleep") -> tuple[subprocess.Popen[str], int | None]:
    """A process holding `path`'s lock (and with mode "child", the pid of its child)."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), mode], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    child = int(holder.stdout.readline()) if mode == "child" else None
    assert holder.stdout.readline().strip() == "locked"
    return holder, child


def test_a_second_locker_is_refused_with_the_holders_pid(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    holder, _ = _hold(path)
    try:
        with pytest.raises(LockHeld) as refused:
            try_lock(path)
        assert refused.value.pid == holder.pid
        assert f"pid {holder.pid}" in str(refused.value)
        assert path.read_text().strip() == str(holder.pid)  # a refusal leaves the file alone
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("death", ["exit", signal.SIGTERM, signal.SIGKILL])
def test_the_lock_is_free_once_its_holder_is_dead(tmp_path: Path, death: str | signal.Signals) -> None:
    path = tmp_path / "x.lock"
    holder, _ = _hold(path, "exit" if death == "exit" else "sleep")
    if death != "exit":
        holder.send_signal(death)
    holder.wait(timeout=10)
    with try_lock(path) as lock:
        assert lock.held
        assert path.read_text().strip() == str(os.getpid())
    assert not lock.held


def test_a_child_that_outlives_the_holder_does_not_keep_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    holder, child = _hold(path, "child")
    assert child is not None
    try:
        holder.kill()
        holder.wait()
        os.kill(child, 0)  # still alive
        try_lock(path).release()
    finally:
        os.kill(child, signal.SIGKILL)


def test_release_lets_the_next_one_in(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    first = try_lock(path)
    with pytest.raises(LockHeld):  # another open of the file, even in this process
        try_lock(path)
    first.release()
    first.release()  # idempotent
    try_lock(path).release()


def test_without_create_a_missing_file_is_not_made(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        try_lock(tmp_path / "absent.lock", create=False)
    assert not (tmp_path / "absent.lock").exists()
