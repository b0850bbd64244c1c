"""Session fixtures shared by every test package: the real default model directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """SmolLM2-135M-Instruct converted into $MLXD_TEST_HOME (default <repo>/.cache/
    test-home), provisioned once and reused by later sessions and other test packages."""
    from models.provision import provision_default_model  # keeps MLX out of other tests

    home = Path(os.environ.get("MLXD_TEST_HOME", REPO / ".cache" / "test-home"))
    return provision_default_model(home)
