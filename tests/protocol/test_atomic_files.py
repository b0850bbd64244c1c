"""protocol.atomic_files: a file or directory is the old one or the new one, never a mix,
and a build that fails or was cut short leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.atomic_files import atomic_replace, temp_path, write_atomically


def _make_file(path: Path, text: str) -> None:
    path.write_text(text)


def _make_dir(path: Path, text: str) -> None:
    path.mkdir()
    (path / "inside.txt").write_text(text)


def _read(path: Path) -> str:
    return (path / "inside.txt").read_text() if path.is_dir() else path.read_text()


@pytest.mark.parametrize("make", [_make_file, _make_dir], ids=["file", "directory"])
@pytest.mark.parametrize("existing", [False, True], ids=["new", "replacing"])
def test_a_finished_build_takes_the_final_name(tmp_path: Path, make, existing: bool) -> None:
    target = tmp_path / "target"
    if existing:
        make(target, "old")
    with atomic_replace(target) as temp:
        assert temp.parent == target.parent and temp.name.startswith(".")
        make(temp, "new")
        if existing:
            assert _read(target) == "old"  # untouched until the block ends
    assert _read(target) == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"]


@pytest.mark.parametrize("make", [_make_file, _make_dir], ids=["file", "directory"])
def test_a_failed_build_leaves_the_old_one_and_no_temporary(tmp_path: Path, make) -> None:
    target = tmp_path / "target"
    make(target, "old")
    with pytest.raises(RuntimeError), atomic_replace(target) as temp:
        make(temp, "half")
        raise RuntimeError("interrupted")
    assert _read(target) == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"]


@pytest.mark.parametrize("make", [_make_file, _make_dir], ids=["file", "directory"])
def test_a_temporary_left_by_a_crash_is_cleared_by_the_next_build(tmp_path: Path, make) -> None:
    target = tmp_path / "target"
    make(temp_path(target), "left by a crash")
    with atomic_replace(target) as temp:
        assert not temp.exists()
        make(temp, "new")
    assert _read(target) == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"]


def test_write_atomically(tmp_path: Path) -> None:
    target = tmp_path / "data.bin"
    write_atomically(target, b"one")
    write_atomically(target, b"two")
    assert target.read_bytes() == b"two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.bin"]
