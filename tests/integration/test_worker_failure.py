"""A worker that dies is noticed at once: its requests fail, it restarts, service goes on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import openai
import pytest
from safetensors.numpy import save_file

from tests.integration.service import REPO, Service, free_port, running_service

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def killable(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    with running_service(["--model", str(default_model_dir)], tmp_path_factory.mktemp("home")) as svc:
        yield svc


def worker_info(svc: Service) -> dict:
    (info,) = svc.health()["workers"].values()
    return info


def test_sigkill_mid_stream_fails_the_stream_then_recovers(killable: Service) -> None:
    client = openai.OpenAI(base_url=f"{killable.base_url}/v1", api_key="x", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    pid = worker_info(killable)["pid"]
    stream = client.chat.completions.create(
        model=model, stream=True, max_tokens=400, temperature=0,
        messages=[{"role": "user", "content": "Write a very long story about a dragon."}],
    )
    received = 0
    started = time.monotonic()
    with pytest.raises(openai.APIError) as excinfo:
        for chunk in stream:
            received += 1
            if received == 3:
                os.kill(pid, signal.SIGKILL)
    assert time.monotonic() - started < 30, "the stream must end promptly, not hang"
    assert "worker" in str(excinfo.value).lower()

    info = worker_info(killable)
    assert info["state"] != "ready" or info["pid"] != pid
    assert info["restarts"] >= 1 or info["state"] in ("restarting", "down", "loading")

    killable.wait_ready(timeout=120)
    assert worker_info(killable)["pid"] != pid
    answer = client.chat.completions.create(
        model=model, temperature=0, max_tokens=20,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
    )
    assert "Paris" in answer.choices[0].message.content


def test_worker_that_dies_before_ready_fails_startup_fast(tmp_path: Path) -> None:
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"model_type": "no_such_architecture"}))
    save_file({"w": np.zeros(4, dtype=np.float32)}, str(broken / "model.safetensors"))
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "router", "serve", "--port", str(free_port()),
         "--home", str(tmp_path / "home"), "--model", str(broken)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    elapsed = time.monotonic() - started
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert "no_such_architecture" in output
    assert elapsed < 60
