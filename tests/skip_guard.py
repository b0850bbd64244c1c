"""A skipped test proves nothing, so CI fails on any skip nobody agreed to.

With MLXD_FAIL_ON_SKIP=1 (what `.ci/run` sets) the session fails when a test skips for a
reason that is not in ALLOWED_SKIPS. Each entry says where the skip may happen and why it
is honest there: a platform or CPU the test cannot run on, never "it was too fast this time"
or "a tool was missing" (CI installs its tools). Outside CI a skip is only reported.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class AllowedSkip:
    """Skips of tests whose node id starts with `nodeid_prefix`, for a reason matching
    `reason`, on platforms where `applies` is true."""

    nodeid_prefix: str
    reason: str
    why: str
    applies: bool = True

    def allows(self, nodeid: str, reason: str) -> bool:
        return self.applies and nodeid.startswith(self.nodeid_prefix) and re.search(self.reason, reason) is not None


ON_MACOS = sys.platform == "darwin"

ALLOWED_SKIPS: tuple[AllowedSkip, ...] = (
    AllowedSkip("tests/protocol/test_sockets.py::", r"needs root",
                "handing a socket directory to another user needs root; CI may run unprivileged"),
    AllowedSkip("tests/worker/test_quantized_kernels.py::test_inner_loop_matches_the_scalar_loop",
                r"this CPU lacks",
                "each SIMD loop runs where the CPU has its instructions (AVX-512 VNNI, AVX-VNNI, AVX2)"),
    AllowedSkip("tests/worker/test_quantized_kernels.py::test_loaded_layers_go_into_panels",
                r"scalar loop only", "a CPU without AVX2 packs nothing into panels"),
    AllowedSkip("tests/worker/", r"the kernels serve MLX's CPU build|fusion runs on the CPU kernels",
                "on macOS the worker runs MLX's Metal kernels, not mlxd's CPU ones", applies=ON_MACOS),
    AllowedSkip("tests/router/test_model_registry.py::", r"macOS serves checkpoints as stored",
                "checkpoint repacking is Linux-only", applies=ON_MACOS),
)

_skipped: list[tuple[str, str]] = []


def _reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Remember every real skip (an xfail is reported as skipped too, and is not one)."""
    if report.skipped and not hasattr(report, "wasxfail"):
        _skipped.append((report.nodeid, _reason(report)))


def unexpected_skips(skipped: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The skips no entry of ALLOWED_SKIPS allows."""
    return [(nodeid, reason) for nodeid, reason in skipped
            if not any(entry.allows(nodeid, reason) for entry in ALLOWED_SKIPS)]


def strict() -> bool:
    return os.environ.get("MLXD_FAIL_ON_SKIP") == "1"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int) -> None:
    unexpected = unexpected_skips(_skipped)
    if not unexpected:
        return
    verdict = "FAILS the run (MLXD_FAIL_ON_SKIP=1)" if strict() else "reported only (MLXD_FAIL_ON_SKIP is not 1)"
    terminalreporter.section(f"skips outside tests/skip_guard.py's allow-list: {verdict}", sep="=", red=True)
    for nodeid, reason in unexpected:
        terminalreporter.line(f"{nodeid}: {reason}")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if strict() and unexpected_skips(_skipped) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
