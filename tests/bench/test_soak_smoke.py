"""bench/soak.py in miniature, on every run of the suite: 2 clients of every dialect for
20 seconds on the default model, one worker killed in the middle, and the greedy probes
answered from scratch before the load must come back token for token after the restart
(from the cache, the cold tier or recomputed). The acceptance soak (50 clients, 10
minutes, every fault) is run by hand; its JSON is in docs/bench/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.test_import_graph import REPO

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def soak(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("soak") / "soak.json"
    command = [sys.executable, "bench/soak.py", "--models", str(default_model_dir), "--clients", "2",
               "--duration-s", "20", "--warmup-s", "5", "--chaos", "--chaos-every-s", "8",
               "--faults", "sigkill_worker", "--hung-s", "60", "--max-tokens", "16", "--out", str(out)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


def test_no_request_is_wrong_hung_or_failed_without_a_clear_error(soak: dict[str, Any]) -> None:
    requests = soak["requests"]
    assert requests["total"] >= 4 and requests["ok"] >= 2, requests
    assert (requests["wrong"], requests["hung"], requests["failed_unclear"]) == (0, 0, 0), requests
    assert soak["still_running_clients"] == 0


def test_the_killed_worker_comes_back_and_the_probes_match_scratch(soak: dict[str, Any]) -> None:
    faults = soak["faults"]
    assert faults["count"] == 1 and faults["by_action"] == {"sigkill_worker": 1}, faults
    assert faults["not_recovered"] == 0 and faults["probe_mismatches"] == 0, faults
    assert faults["verified_by_a_replay"] == 1, faults
    assert soak["probes"]["first_cached_match"] is True
    assert soak["final_probes_match"] is True
