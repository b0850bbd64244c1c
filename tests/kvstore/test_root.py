"""The store's directory: one kvstore process at a time on it, and private modes (the
blocks hold users' prompts), also for a store an older version left world-readable."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvstore.store import make_private
from protocol.sockets import make_runtime_dir
from tests.kvstore.helpers import REPO, KVClient, KVProcess, key, payload

pytestmark = pytest.mark.timeout(60)


def _modes(root: Path) -> dict[str, int]:
    paths = [root, *root.rglob("*")]
    return {p.relative_to(root).as_posix(): stat.S_IMODE(p.lstat().st_mode) for p in paths if not p.is_symlink()}


def test_a_second_kvstore_on_the_same_root_refuses_to_start(tmp_path: Path) -> None:
    runtime = make_runtime_dir("kvt-")
    first = KVProcess(tmp_path / "store", runtime).start()
    try:
        second = subprocess.run(
            [sys.executable, "-m", "kvstore", "--bind", f"ipc://{runtime}/kv2", "--root", str(first.root)],
            cwd=REPO, capture_output=True, text=True, timeout=30,
        )
        assert second.returncode == 2
        assert f"another kvstore (pid {first.process.pid}) is using {first.root}" in second.stderr
        assert not (runtime / "kv2").exists()  # never bound: no worker could reach it
        assert first.process.poll() is None
    finally:
        first.stop()
        for path in runtime.iterdir():
            path.unlink()
        runtime.rmdir()


def test_a_restart_waits_for_its_predecessor_to_let_go(tmp_path: Path) -> None:
    """A kvstore still writing its last blocks after its router died must not make the
    next service's kvstore fail: the lock is waited for, briefly."""
    runtime = make_runtime_dir("kvt-")
    first = KVProcess(tmp_path / "store", runtime).start()
    second = KVProcess(tmp_path / "store", runtime)
    second.address = f"ipc://{runtime}/kv2"
    try:
        started = subprocess.Popen(  # stops the first a second after the second starts
            [sys.executable, "-c", f"import os, time; time.sleep(1); os.kill({first.process.pid}, 15)"])
        second.start()
        started.wait()
        assert "waiting for the kvstore" in second.log()
        client = KVClient(second.address)
        try:
            client.put("m", [(key(1), payload(1))])
        finally:
            client.close()
    finally:
        first.stop()
        second.stop()
        for path in runtime.iterdir():
            path.unlink()
        runtime.rmdir()


def test_an_old_world_readable_store_is_made_private(tmp_path: Path) -> None:
    root = tmp_path / "store"
    (root / "segments").mkdir(parents=True)
    (root / "segments" / "seg-00000001.log").write_bytes(b"")
    (root / "index.bin").write_bytes(b"x")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("not ours")
    (root / "link").symlink_to(elsewhere)
    for path in [root, root / "segments", root / "segments" / "seg-00000001.log", root / "index.bin", elsewhere]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    make_private(root)
    assert _modes(root) == {".": 0o700, "segments": 0o700, "segments/seg-00000001.log": 0o600, "index.bin": 0o600}
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o644  # a symlink's target is left alone


def test_the_process_makes_its_files_private(tmp_path: Path) -> None:
    runtime = make_runtime_dir("kvt-")
    old_umask = os.umask(0o022)
    try:
        process = KVProcess(tmp_path / "store", runtime).start()
    finally:
        os.umask(old_umask)
    try:
        client = KVClient(process.address)
        try:
            client.put("m", [(key(i), payload(i)) for i in range(4)])
        finally:
            client.close()
        deadline = time.monotonic() + 10
        while not list((process.root / "segments").glob("*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        process.signal(15)
    finally:
        process.stop()
        for path in runtime.iterdir():
            path.unlink()
        runtime.rmdir()
    modes = _modes(process.root)
    assert {m for p, m in modes.items() if (process.root / p).is_dir()} == {0o700}
    assert {m for p, m in modes.items() if (process.root / p).is_file()} == {0o600}, modes
