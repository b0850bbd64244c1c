"""SIGTERM, as launchd and systemd send it, on the real service: running streams finish,
a request arriving meanwhile gets 503 + Retry-After (in its API's shape), the process
exits 0 and leaves no worker or kvstore behind."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.integration.service import Service

pytestmark = pytest.mark.timeout(300)
QUESTION = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]


def stream(base_url: str, model: str, out: dict) -> None:
    body = {"model": model, "messages": QUESTION, "max_tokens": 160, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    out["chunks"], out["finish"], out["done"] = 0, None, False
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=120) as response:
        out["status"] = response.status_code
        for line in response.iter_lines():
            if line == "data: [DONE]":
                out["done"] = True
            elif line.startswith("data: "):
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    out["error"] = chunk["error"]
                for choice in chunk.get("choices") or []:
                    out["chunks"] += 1
                    out["finish"] = choice.get("finish_reason") or out["finish"]


def test_sigterm_drains_running_streams_turns_new_requests_away_and_exits_clean(
        default_model_dir: Path, tmp_path: Path) -> None:
    service = Service(["--model", str(default_model_dir), "--shutdown-drain-s", "60"], home=tmp_path / "home")
    try:
        service.wait_ready()
        model = httpx.get(f"{service.base_url}/v1/models", timeout=10).json()["data"][0]["id"]
        children = psutil.Process(service.proc.pid).children(recursive=True)
        assert len(children) >= 2  # the worker and the kvstore
        results = [{} for _ in range(4)]
        threads = [threading.Thread(target=stream, args=(service.base_url, model, r)) for r in results]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 120
        while min(r.get("chunks", 0) for r in results) < 2:
            assert time.monotonic() < deadline, results
            time.sleep(0.05)
        service.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        late = httpx.post(f"{service.base_url}/v1/chat/completions", timeout=30,
                          json={"model": model, "messages": QUESTION, "max_tokens": 4})
        late_anthropic = httpx.post(f"{service.base_url}/v1/messages", timeout=30,
                                    headers={"anthropic-version": "2023-06-01"},
                                    json={"model": model, "max_tokens": 4, "messages": QUESTION})
        health = httpx.get(f"{service.base_url}/health", timeout=30)
        assert any(r.get("finish") is None for r in results), "the streams outlasted the late requests"
        assert health.status_code == 503 and health.json()["status"] == "draining", health.text
        for thread in threads:
            thread.join(timeout=120)
        assert late.status_code == 503 and late.headers["retry-after"], late.text
        assert late.json()["error"]["code"] == "shutting_down"
        assert late_anthropic.status_code == 503 and late_anthropic.headers["retry-after"]
        assert late_anthropic.json()["type"] == "error"
        for result in results:
            assert result["status"] == 200 and "error" not in result, result
            assert result["done"] and result["finish"] in ("stop", "length"), result
        assert service.proc.wait(timeout=90) == 0
        time.sleep(1)
        left = [child.pid for child in children if child.is_running() and child.status() != psutil.STATUS_ZOMBIE]
        assert not left, f"children still running after exit: {left}"
    finally:
        service.stop()
