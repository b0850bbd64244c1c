"""One `mlxd serve` per home: a second one refuses at once, naming the first; `config
show` never takes the lock; the home is made private."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.cli import serve

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(60)

HOLDER = """
import sys, time
from protocol.locks import try_lock
lock = try_lock(sys.argv[1])
print("locked", flush=True)
time.sleep(60)
"""


@pytest.fixture
def held_home(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A home whose lock a live process holds (as a serving mlxd would)."""
    home = tmp_path / "home"
    home.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(home / serve.HOME_LOCK)], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    yield home, holder.pid
    holder.kill()
    holder.wait()


def _mlxd(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MLXD_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "router", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)


def test_a_second_serve_on_the_same_home_refuses_at_once(held_home: tuple[Path, int], tmp_path: Path) -> None:
    home, pid = held_home
    model = tmp_path / "model"  # never looked at: the refusal comes first
    started = time.monotonic()
    result = _mlxd("serve", "--home", str(home), "--model", str(model), "--port", "8999", home=home)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"mlxd: another mlxd (pid {pid}) is already serving home {home}; stop it first or use --home")
    assert "Traceback" not in result.stderr and "cannot listen" not in result.stderr
    assert time.monotonic() - started < 30


def test_config_show_does_not_take_the_lock(held_home: tuple[Path, int]) -> None:
    home, _ = held_home
    result = _mlxd("config", "show", "--home", str(home), home=home)
    assert result.returncode == 0, result.stderr
    assert "port" in result.stdout


def test_claim_home_makes_it_private_and_holds_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    home.chmod(0o755)  # as an older version left it
    lock = serve.claim_home(home)
    assert lock is not None
    try:
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        assert stat.S_IMODE((home / serve.HOME_LOCK).stat().st_mode) == 0o600
        assert serve.claim_home(home) is None  # even from this process: one holder at a time
        assert f"another mlxd (pid {os.getpid()})" in capsys.readouterr().err
    finally:
        lock.release()
    second = serve.claim_home(home)
    assert second is not None
    second.release()


def test_a_new_home_is_private(tmp_path: Path) -> None:
    home = tmp_path / "a" / "home"
    lock = serve.claim_home(home)
    assert lock is not None
    lock.release()
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
