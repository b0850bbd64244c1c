"""`mlxd status`: the admin status as a table (every documented field has a place, absent
ones print as "-"), and a clear failure when nothing answers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from router.cli.status import format_status
from router.cli.tables import duration, size

STATUS = {
    "version": "0.1.0", "uptime_s": 812.4,
    "memory": {"total_bytes": 24 << 30, "available_bytes": 15 << 30, "budget_bytes": 12 << 30,
               "used_bytes": 3 << 30, "workers": {"qwen2.5-coder-0.5b": 2 << 30}},
    "models": [
        {"id": "qwen2.5-coder-0.5b", "kind": "mlx", "state": "ready", "pinned": True, "ttl_s": None,
         "ttl_left_s": None, "last_used": 1.7e9, "pid": 4242, "rss_bytes": 2 << 30, "estimated_bytes": 2 << 30,
         "requests_in_flight": 1, "restarts": 0, "recent_prompt_tok_s": 101.5, "recent_decode_tok_s": 5.9,
         "hot_tier": {"bytes": 120 << 20, "budget_bytes": 1536 << 20, "blocks": 40, "hit_rate": 0.63}},
        {"id": "SmolLM2-135M-Instruct", "kind": "mlx", "state": "unloaded", "pinned": False, "ttl_s": 600,
         "ttl_left_s": None, "last_used": None, "pid": None, "rss_bytes": None, "estimated_bytes": 300 << 20,
         "requests_in_flight": 0, "restarts": 0, "recent_prompt_tok_s": None, "recent_decode_tok_s": None,
         "hot_tier": None},
    ],
    "kvstore": {"state": "ready", "pid": 4243, "restarts": 0, "last_error": None, "last_ping_s": 0.4,
                "root": "/x", "bytes": 2 << 30, "max_bytes": 10 << 30, "blocks": 1234, "segments": 9,
                "hit_rate": 0.4, "write_queue_depth": 0, "dropped_writes": 0, "evictions": 0, "namespaces": {}},
    "requests": [{"id": "msg_1", "model": "qwen2.5-coder-0.5b", "user_agent": "claude-cli/2.1.197",
                  "state": "decoding", "tokens": 17, "age_s": 75.2}],
}


def test_the_table_shows_models_memory_tiers_and_requests() -> None:
    text = format_status(STATUS, "http://127.0.0.1:8000")
    lines = text.splitlines()
    assert lines[0] == "mlxd 0.1.0 at http://127.0.0.1:8000, up 13m32s"
    assert "3.0 GiB used by models of a 12.0 GiB budget" in lines[1]
    header = next(line for line in lines if line.startswith("MODEL"))
    qwen = next(line for line in lines if line.startswith("qwen2.5-coder-0.5b"))
    smol = next(line for line in lines if line.startswith("SmolLM2-135M-Instruct"))
    assert qwen.split()[1:4] == ["ready", "yes", "2.0"] and "63%" in qwen and "101.5" in qwen
    assert smol.split()[1:3] == ["unloaded", "no"] and "300.0 MiB" in smol  # the estimate when not loaded
    assert header.index("STATE") == qwen.index("ready") == smol.index("unloaded")  # aligned columns
    assert "cold tier (ready): 2.0 GiB of 10.0 GiB, 1234 blocks, hit 40%" in text
    assert any(line.startswith("msg_1") and "decoding" in line and "1m15s" in line for line in lines)


def test_an_idle_service_without_a_cold_tier() -> None:
    text = format_status({**STATUS, "kvstore": None, "requests": []}, "http://h:1")
    assert "cold tier: off" in text and "requests: none in flight" in text


def test_units() -> None:
    assert size(512) == "512 B" and size(1536) == "1.5 KiB" and size(None) == "-"
    assert duration(59) == "59s" and duration(3725) == "1h02m"


def test_nothing_listening_is_a_clear_error(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "router", "status", "--home", str(tmp_path), "--port", "1"],
                          capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 1 and "no mlxd answering at http://127.0.0.1:1" in done.stderr
