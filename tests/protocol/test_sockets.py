"""protocol.sockets runtime dirs: a router's dir is swept away once it is dead, and
never while it lives, nor anything that is not a runtime dir of this user."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol.locks import LockHeld, try_lock
from protocol.sockets import RUNTIME_LOCK, claim_runtime_dir, remove_stale_runtime_dirs

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def base() -> Iterator[Path]:
    """A short private base dir (socket paths are capped near 104 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="rtb-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _runtime_dir(base: Path, name: str = "mlxd-abcd1234", *, lock: bool = True, sockets: int = 1) -> Path:
    """A runtime dir as a router leaves it: its lock file and sockets nobody listens on."""
    path = base / name
    path.mkdir(mode=0o700)
    if lock:
        try_lock(path / RUNTIME_LOCK).release()
    for i in range(sockets):
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(path / f"s{i}"))
    return path


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


HOLDER = """
import sys, time
from protocol.locks import try_lock
lock = try_lock(sys.argv[1])
print("locked", flush=True)
time.sleep(60)
"""


@pytest.fixture
def hold() -> Iterator[list[subprocess.Popen[str]]]:
    holders: list[subprocess.Popen[str]] = []
    yield holders
    for holder in holders:
        holder.kill()
        holder.wait()


def _hold(holders: list[subprocess.Popen[str]], path: Path) -> subprocess.Popen[str]:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    holders.append(holder)
    return holder


def test_a_dead_routers_dir_is_removed(base: Path) -> None:
    dead = _runtime_dir(base)
    assert remove_stale_runtime_dirs(base) == [dead]
    assert not dead.exists()


def test_a_live_routers_dir_is_kept_until_it_dies(base: Path, hold: list[subprocess.Popen[str]]) -> None:
    live = _runtime_dir(base)
    _age(live, 3600)
    holder = _hold(hold, live / RUNTIME_LOCK)
    assert remove_stale_runtime_dirs(base) == []
    assert (live / "s0").exists()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert remove_stale_runtime_dirs(base) == [live]


@pytest.mark.parametrize("age_s, listening, removed", [
    (5, False, False),  # may be being made right now
    (3600, False, True),  # an older version's router, dead
    (3600, True, False),  # an older version's router, alive: its socket answers
])
def test_a_dir_without_lock_file(base: Path, age_s: float, listening: bool, removed: bool) -> None:
    old = _runtime_dir(base, lock=False, sockets=0)
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(old / "workers"))
    if listening:
        server.listen()
    _age(old, age_s)
    try:
        assert remove_stale_runtime_dirs(base) == ([old] if removed else [])
        assert old.exists() != removed
    finally:
        server.close()


@pytest.mark.parametrize("name, content", [
    ("mlxd-home", None),  # not a name mkdtemp makes: maybe someone's --home
    ("mlxd-abcd1234", "config.toml"),  # holds a regular file: not a runtime dir
    ("mlxd-abcd1234", "models/"),  # holds a directory
    ("other-abcd1234", None),  # another prefix
])
def test_what_is_not_a_runtime_dir_is_never_touched(base: Path, name: str, content: str | None) -> None:
    path = _runtime_dir(base, name)
    if content and content.endswith("/"):
        (path / content).mkdir()
    elif content:
        (path / content).write_text("x")
    _age(path, 3600)
    assert remove_stale_runtime_dirs(base) == []
    assert path.exists()


def test_a_symlink_is_not_followed(base: Path, tmp_path: Path) -> None:
    target = _runtime_dir(tmp_path)
    (base / "mlxd-link1234").symlink_to(target)
    assert remove_stale_runtime_dirs(base) == []
    assert target.exists()


@pytest.mark.skipif(os.getuid() != 0, reason="giving a dir to another user needs root")
def test_another_users_dir_is_never_touched(base: Path) -> None:
    theirs = _runtime_dir(base)
    os.chown(theirs, 4242, -1)
    assert remove_stale_runtime_dirs(base) == []
    assert theirs.exists()


def test_claim_sweeps_dead_dirs_and_holds_its_own(base: Path, monkeypatch: pytest.MonkeyPatch,
                                                  hold: list[subprocess.Popen[str]]) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(base))
    dead = _runtime_dir(base, "mlxd-dead1234")
    live = _runtime_dir(base, "mlxd-live1234")
    _hold(hold, live / RUNTIME_LOCK)
    path, lock = claim_runtime_dir()
    try:
        assert path.parent == base and path.stat().st_mode & 0o777 == 0o700
        assert not dead.exists() and live.exists()
        assert sorted(p.name for p in path.iterdir()) == [RUNTIME_LOCK]
        with pytest.raises(LockHeld):  # ours, for as long as we hold it
            try_lock(path / RUNTIME_LOCK, create=False)
        assert remove_stale_runtime_dirs(base) == []
    finally:
        lock.release()
    assert remove_stale_runtime_dirs(base) == [path]
