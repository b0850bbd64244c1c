"""tests/skip_guard.py: CI fails on a skip nobody agreed to, and only then."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.skip_guard import unexpected_skips
from tests.test_import_graph import REPO

SKIPPING = '''
import pytest

def test_fast_enough():
    pytest.skip("prefilled within one keep-alive interval: nothing to hang up on")

def test_runs():
    assert True
'''


def run_pytest(tmp_path: Path, fail_on_skip: bool) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_sample.py").write_text(SKIPPING)
    env = {k: v for k, v in os.environ.items() if k != "MLXD_FAIL_ON_SKIP"}
    if fail_on_skip:
        env["MLXD_FAIL_ON_SKIP"] = "1"
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.skip_guard", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), str(tmp_path / "test_sample.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_an_unlisted_skip_fails_the_run_in_ci(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, fail_on_skip=True)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "skips outside tests/skip_guard.py's allow-list: FAILS the run" in done.stdout
    assert "test_sample.py::test_fast_enough: prefilled within one keep-alive interval" in done.stdout


def test_outside_ci_an_unlisted_skip_is_reported_only(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, fail_on_skip=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reported only" in done.stdout


def test_the_allow_list_names_where_and_why() -> None:
    allowed = ("tests/worker/test_quantized_kernels.py::test_inner_loop_matches_the_scalar_loop[avx512-vnni]",
               "this CPU lacks avx512-vnni (it ran avx2)")
    elsewhere = ("tests/worker/test_cpu_kernels.py::test_logsumexp", "this CPU lacks avx512-vnni (it ran avx2)")
    timing = ("tests/integration/test_anthropic_messages.py::test_x", "nothing to hang up on")
    assert unexpected_skips([allowed, elsewhere, timing]) == [elsewhere, timing]
