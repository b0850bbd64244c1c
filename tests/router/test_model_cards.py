"""`GET /v1/models` tells a client the window and the output cap each chat model serves,
also for a model no worker has loaded yet (from its config.json, as the worker will read it),
and which model is the default: what `mlxd launch` hands to the agents."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.router.router_harness import MODEL_ID, RunningRouter, start_router

pytestmark = pytest.mark.timeout(60)

OTHER = "other-model"  # on disk, never loaded by these tests


@pytest.fixture
def home_models(model_dir: Path) -> Path:
    models = model_dir.parent / "home" / "models"
    (models / OTHER).mkdir(parents=True)
    (models / OTHER / "config.json").write_text(json.dumps({"max_position_embeddings": 32768}))
    return models


@pytest.fixture
def capped(model_dir: Path, home_models: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningRouter]:
    profiles = {f"{OTHER}:small": {"context_limit": 6000, "max_output_tokens": 512}}
    yield from start_router(model_dir, monkeypatch, max_context_tokens=16384, max_output_tokens=2048,
                            profiles=profiles, models={OTHER: {"max_output_tokens": 1024}})


@pytest.fixture
def plain(model_dir: Path, home_models: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningRouter]:
    yield from start_router(model_dir, monkeypatch)


def _cards(router: RunningRouter) -> dict[str, dict]:
    with router.client() as client:
        return {card["id"]: card for card in client.get("/v1/models").json()["data"]}


def test_an_unloaded_model_reports_the_window_of_its_files(plain: RunningRouter) -> None:
    cards = _cards(plain)
    assert cards[OTHER]["state"] == "unloaded"
    assert cards[OTHER]["context_length"] == 32768 and cards[OTHER]["max_output_tokens"] == 4096
    # a loaded model reports what its worker serves (the fake worker says 2048)
    assert cards[MODEL_ID]["context_length"] == 2048
    assert cards[MODEL_ID]["default"] is True and "default" not in cards[OTHER]
    # an embedding model has no chat window to report
    assert "context_length" not in cards["all-MiniLM-L6-v2"] and "max_output_tokens" not in cards["all-MiniLM-L6-v2"]
    with plain.client() as client:
        alias = client.get("/v1/models/claude-some-name").json()  # the default model_aliases
    assert alias["id"] == "claude-some-name" and alias["alias_of"] == MODEL_ID and "default" not in alias
    assert alias["context_length"] == 2048


def test_caps_from_settings_profiles_and_model_tables(capped: RunningRouter) -> None:
    cards = _cards(capped)
    assert cards[OTHER]["context_length"] == 16384  # max_context_tokens caps the declared 32768
    assert cards[OTHER]["max_output_tokens"] == 1024  # [models."other-model"] is tighter than 2048
    assert cards[MODEL_ID]["max_output_tokens"] == 2048
    profile = cards[f"{OTHER}:small"]
    assert profile["context_length"] == 6000 and profile["max_output_tokens"] == 512
    assert profile["profile_of"] == OTHER and "default" not in profile
