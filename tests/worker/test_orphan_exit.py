"""A worker whose router died (SIGKILL: no Shutdown, and its kvstore gone too) exits
within a second or two, instead of waiting for an SSD flush nobody will confirm."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(180)

# The worker's parent: handshakes like the router, with a kvstore address nobody serves,
# then dies at once once the worker is ready.
FAKE_ROUTER = """
import os, signal, subprocess, sys
import zmq
from protocol.codec import decode, encode
from protocol.messages import PROTOCOL_VERSION, Hello, Ready, StartupFailed, WorkerConfig
from protocol.sockets import make_socket

address, model, kvstore, log = sys.argv[1:5]
sock = make_socket(zmq.Context(), zmq.ROUTER, address, bind=True)
with open(log, "ab") as out:
    worker = subprocess.Popen([sys.executable, "-m", "worker", "--connect", address, "--identity", "m#1"],
                              stdout=out, stderr=out)
print(worker.pid, flush=True)
while True:
    if not sock.poll(120_000):
        sys.exit("the worker said nothing")
    identity, *parts = sock.recv_multipart()
    message, _ = decode(parts)
    if isinstance(message, Hello):
        config = WorkerConfig(protocol_version=PROTOCOL_VERSION, model_id="m", model_path=model,
                              kvstore_address=kvstore)
        sock.send_multipart([identity, *encode(config)])
    elif isinstance(message, StartupFailed):
        sys.exit(message.message)
    elif isinstance(message, Ready):
        break
print("ready", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _gone(pid: int) -> bool:
    try:  # an orphan may wait a while to be reaped: a zombie counts as gone
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_an_orphaned_worker_exits_promptly(default_model_dir: Path, tmp_path: Path) -> None:
    runtime = Path(tempfile.mkdtemp(prefix="wko-", dir="/tmp"))
    log = tmp_path / "worker.log"
    try:
        router = subprocess.Popen(
            [sys.executable, "-c", FAKE_ROUTER, f"ipc://{runtime}/w", str(default_model_dir),
             f"ipc://{runtime}/kv-nobody", str(log)],
            cwd=REPO, stdout=subprocess.PIPE, text=True)
        assert router.stdout is not None
        worker = int(router.stdout.readline())
        try:
            assert router.stdout.readline().strip() == "ready", log.read_text()
            router.wait(timeout=10)
            orphaned_at = time.monotonic()
            while not _gone(worker) and time.monotonic() - orphaned_at < 30:
                time.sleep(0.05)
            lifetime_s = time.monotonic() - orphaned_at
        finally:
            if not _gone(worker):
                psutil.Process(worker).kill()
        text = log.read_text()
        assert "router went away" in text
        assert lifetime_s < 3.0, f"the orphaned worker lived {lifetime_s:.1f} s more:\n{text[-3000:]}"
        assert "Traceback" not in text
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
