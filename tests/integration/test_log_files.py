"""Log files on the real service, run once with `--log-format json` and a small
`--log-max-bytes`: the router, the kvstore and the worker each write JSON lines to their own
rotating file, the request's x-request-id is in router.log, the worker's lines reach the
service's stderr with one timestamp, and `mlxd logs` reads the worker's file."""

from __future__ import annotations

import json
import re
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.integration.service import REPO, Service, running_service
from tests.integration.test_pool import make_tiny_dir

pytestmark = pytest.mark.timeout(300)

TINY = "tiny-llama"
MAX_BYTES = 1000  # small: the worker's start alone fills more than one file
ISO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d")


@pytest.fixture(scope="module")
def service(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    models = tmp_path_factory.mktemp("models")
    make_tiny_dir(models / TINY, default_model_dir)
    with running_service(["--model-dir", str(models), "--model", TINY, "--log-format", "json",
                          "--log-max-bytes", str(MAX_BYTES), "--log-level", "debug"],
                         tmp_path_factory.mktemp("home")) as svc:
        yield svc


@pytest.fixture(scope="module")
def request_id(service: Service) -> str:
    client = openai.OpenAI(base_url=f"{service.base_url}/v1", api_key="x", max_retries=0, timeout=120)
    raw = client.chat.completions.with_raw_response.create(
        model=TINY, messages=[{"role": "user", "content": "Hello"}], max_tokens=4, temperature=0)
    assert raw.parse().choices
    return raw.headers["x-request-id"]


def json_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_each_process_writes_json_lines_to_its_own_private_file(service: Service, request_id: str) -> None:
    logs = service.home / "logs"
    roles = {"router.log": "router", "kvstore.log": "kvstore", f"worker-{TINY}.log": f"worker[{TINY}#1]"}
    for name, role in roles.items():
        entries = json_lines(logs / name)
        assert entries, name
        assert all(e.keys() >= {"ts", "level", "role", "logger", "msg"} and e["role"] == role for e in entries), name
    files = list(logs.iterdir())
    assert {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o600}
    assert (logs / f"worker-{TINY}.log.1").exists()  # rotated at MAX_BYTES
    # a file only grows past the cap by a record longer than the cap itself
    assert all(p.stat().st_size <= MAX_BYTES or len(p.read_text().splitlines()) == 1 for p in files)


def router_entries(logs: Path) -> list[dict]:
    """router.log and its rotated backups: at MAX_BYTES the lines after the request's
    (uvicorn's access line at debug) may already have rotated it into router.log.1."""
    entries = []
    for path in sorted(logs.glob("router.log*")):
        try:
            entries += json_lines(path)
        except FileNotFoundError:  # rotated away between the glob and the read
            pass
    return entries


def test_the_request_id_is_in_router_log(service: Service, request_id: str) -> None:
    assert request_id.startswith("chatcmpl-")
    logs = service.home / "logs"
    deadline = time.monotonic() + 10  # the line is written when the worker's finish event arrives
    while not [e for e in router_entries(logs) if e.get("request_id") == request_id]:
        assert time.monotonic() < deadline, (logs / "router.log").read_text()[-2000:]
        time.sleep(0.1)
    [finished] = [e for e in router_entries(logs) if e.get("request_id") == request_id]
    assert request_id in finished["msg"] and finished["logger"] == "router.requests"


def test_forwarded_worker_lines_carry_one_timestamp(service: Service, request_id: str) -> None:
    lines = service.log_text().splitlines()
    forwarded = [line for line in lines if f'"role": "worker[{TINY}#1]"' in line]
    assert len(forwarded) > 3, lines[:20]
    for line in forwarded:
        assert json.loads(line)["role"] == f"worker[{TINY}#1]", line  # the worker's own line, not wrapped
        assert len(ISO_TIME.findall(line)) == 1, line
    worker_file = (service.home / "logs" / f"worker-{TINY}.log").read_text().splitlines()
    assert set(worker_file) & set(forwarded)  # the same lines, byte for byte


def test_mlxd_logs_prints_the_worker_lines(service: Service, request_id: str) -> None:
    done = subprocess.run([sys.executable, "-m", "router", "logs", "-n", "5", "--role", "worker",
                           "--home", str(service.home)], cwd=REPO, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    printed = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(printed) == 5
    assert {e["role"] for e in printed} == {f"worker[{TINY}#1]"}
    assert [e["ts"] for e in printed] == sorted(e["ts"] for e in printed)
