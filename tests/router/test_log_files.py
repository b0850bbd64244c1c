"""router.log_files: each process writes its own file, the router passes a child's log lines
to its stderr unchanged (one timestamp, the child's role) and keeps them out of router.log,
while a child's other output (a crash message) lands in router.log."""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from protocol.log_format import LOG_FILE_ENV, LOG_FORMAT_ENV, LOG_LEVEL_ENV, STDERR_LEVEL_ENV, parse_line
from router.config import make_config
from router.config_values import ConfigError
from router.log_files import (
    child_log_env,
    log_dir,
    open_router_log,
    worker_log_name,
    worker_model,
)

REPO = Path(__file__).resolve().parents[2]
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d")


@pytest.mark.parametrize("model_id, file_name", [
    ("SmolLM2-135M-Instruct", "worker-SmolLM2-135M-Instruct.log"),
    ("mlx-community/Qwen2.5-0.5B", "worker-mlx-community%2FQwen2.5-0.5B.log"),
    ("a b%c", "worker-a%20b%25c.log"),
    ("x.log", "worker-x.log.log"),
])
def test_a_model_id_is_one_file_name_and_back(model_id: str, file_name: str) -> None:
    assert worker_log_name(model_id) == file_name
    assert worker_model(file_name) == model_id


def test_the_children_learn_the_files_from_the_environment(tmp_path: Path) -> None:
    config = make_config({"home": tmp_path, "log_format": "json", "log_level": "debug"})
    env = child_log_env(config, "worker", "org/m")
    assert env[LOG_FILE_ENV] == str(tmp_path / "logs" / "worker-org%2Fm.log")
    assert (env[LOG_FORMAT_ENV], env[LOG_LEVEL_ENV]) == ("json", "debug")
    assert child_log_env(config, "kvstore", "kvstore")[LOG_FILE_ENV] == str(tmp_path / "logs" / "kvstore.log")
    off = make_config({"home": tmp_path, "log_files": False, "log_dir": "/elsewhere"})
    assert child_log_env(off, "kvstore", "kvstore")[LOG_FILE_ENV] == ""  # empty, so no inherited value applies
    assert log_dir(off) == Path("/elsewhere")


@pytest.mark.parametrize("key, value", [("log_max_bytes", -1), ("log_backups", 0)])
def test_a_bad_rotation_setting_names_its_key(tmp_path: Path, key: str, value: int) -> None:
    with pytest.raises(ConfigError) as caught:
        make_config({"home": tmp_path, key: value})
    assert caught.value.key == key


ROUTER = """
import asyncio, logging, sys
from pathlib import Path
from router.children.child_process import ChildProcess
from router.config import make_config
from router.log_files import child_log_env, configure_router_logging, open_router_log

config = make_config({"home": Path(sys.argv[1]), "log_format": sys.argv[2]})
configure_router_logging("info", config.log_format)
open_router_log(config)
logging.getLogger("router.children.pool").info("router line")
CHILD = ("from protocol.log_format import configure_child_logging; configure_child_logging('worker[m#1]')\\n"
         "import logging; log = logging.getLogger('worker.engine'); log.info('child line'); log.debug('hidden')\\n"
         "print('Fatal Python error: Segmentation fault', flush=True)")

async def main() -> None:
    child = ChildProcess([sys.executable, "-c", CHILD], label="worker[m#1]", env=child_log_env(config, "worker", "m"))
    await child.exited
    await child.output_tail()

asyncio.run(main())
"""


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_child_lines_pass_through_once_and_stay_out_of_router_log(tmp_path: Path, log_format: str) -> None:
    done = subprocess.run([sys.executable, "-c", ROUTER, str(tmp_path), log_format], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    logs = tmp_path / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["router.log", "worker-m.log"]
    assert {stat.S_IMODE(p.stat().st_mode) for p in logs.iterdir()} == {0o600}
    [child_line] = (logs / "worker-m.log").read_text().splitlines()
    assert "child line" in child_line and "Segmentation" not in child_line
    stderr = done.stderr.splitlines()
    assert child_line in stderr  # as the child wrote it, not re-stamped
    assert all(len(TIMESTAMP.findall(line)) == 1 for line in stderr), stderr
    assert all(parse_line(line) is not None for line in stderr), stderr  # the crash message too, as a router line
    router_log = (logs / "router.log").read_text()
    assert "router line" in router_log and "child line" not in router_log
    crash = next(line for line in router_log.splitlines() if "Segmentation fault" in line)
    assert crash in stderr
    if log_format == "json":
        entry = json.loads(crash)
        assert (entry["role"], entry["level"]) == ("router", "WARNING")
        assert entry["msg"] == "worker[m#1]| Fatal Python error: Segmentation fault"
    else:
        assert crash.endswith(" WARNING router router.children.child_process: worker[m#1]| Fatal Python error: "
                              "Segmentation fault")


def test_the_router_log_directory_is_made_private(tmp_path: Path) -> None:
    config = make_config({"home": tmp_path, "log_dir": tmp_path / "a" / "logs"})
    root = logging.getLogger()
    before = list(root.handlers)
    try:
        open_router_log(config)
    finally:
        for handler in set(root.handlers) - set(before):
            root.removeHandler(handler)
            handler.close()
    assert stat.S_IMODE((tmp_path / "a" / "logs").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "a" / "logs" / "router.log").stat().st_mode) == 0o600


def test_under_launchd_stderr_keeps_only_warnings_once_the_files_are_open(tmp_path: Path) -> None:
    """The launchd agent sets MLXD_STDERR_LEVEL: launchd never rotates the file stderr goes to,
    so past start-up only warnings reach it, while the files get everything."""
    done = subprocess.run([sys.executable, "-c", ROUTER, str(tmp_path), "text"], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False,
                          env={**os.environ, STDERR_LEVEL_ENV: "warning"})
    assert done.returncode == 0, done.stderr
    assert "router line" not in done.stderr and "child line" not in done.stderr
    assert "Segmentation fault" in done.stderr  # a warning still reaches it
    assert "router line" in (tmp_path / "logs" / "router.log").read_text()
    assert "child line" in (tmp_path / "logs" / "worker-m.log").read_text()
