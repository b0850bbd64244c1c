"""Fixtures for kvstore tests: a `python -m kvstore` process and a DEALER client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol.sockets import make_runtime_dir
from tests.kvstore.helpers import KVClient, KVProcess


@pytest.fixture
def kv_process(tmp_path: Path) -> Iterator[KVProcess]:
    runtime = make_runtime_dir("kvt-")
    proc = KVProcess(tmp_path / "store", runtime)
    try:
        yield proc
    finally:
        proc.stop()
        for path in runtime.iterdir():
            path.unlink()
        runtime.rmdir()


@pytest.fixture
def kv_client(kv_process: KVProcess) -> Iterator[KVClient]:
    client = KVClient(kv_process.address)
    try:
        yield client
    finally:
        client.close()
