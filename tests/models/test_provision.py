"""Provisioning the default model: a finished home is returned at once, an unmarked or
interrupted one is converted again and never looks complete in between."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q
from mlx_lm.utils import load_model

from models import provision
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
