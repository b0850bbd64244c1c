"""Fixtures for router tests; the harness itself is in router_harness.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.router.router_harness import MODEL_ID, RunningRouter, start_router


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    path = tmp_path / MODEL_ID
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


@pytest.fixture
def router(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningRouter]:
    yield from start_router(model_dir, monkeypatch)
