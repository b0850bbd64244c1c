"""Files and directories that appear whole or not at all: built under a temporary name
beside their final one, made durable, then renamed into place. Every process writes some
(the kvstore its index, the model tools their downloads and conversions)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

TEMP_SUFFIX = ".tmp"  # what a build cut short by a crash leaves behind ends with


def temp_path(path: Path) -> Path:
    """Where `path` is built: a hidden sibling, so the rename stays on one filesystem and
    a listing of the directory does not show a half-made entry."""
    return path.with_name(f".{path.name}{TEMP_SUFFIX}")


@contextlib.contextmanager
def atomic_replace(path: Path | str) -> Iterator[Path]:
    """Build `path` (a file or a directory) at the yielded temporary path, then put it in place.

    When the block ends without an exception, what it wrote is fsynced, renamed over
    `path` and the parent directory fsynced: after a crash or power loss `path` holds the
    old content or the new, never a mix. A directory already at `path` is removed just
    before the rename (a rename cannot replace a non-empty one). When the block raises,
    the temporary is removed and `path` is left as it was. A temporary left by a crash is
    removed by the next build of the same path; one writer per path at a time.
    """
    path = Path(path)
    temp = temp_path(path)
    _remove(temp)
    try:
        yield temp
        _fsync_tree(temp)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        os.replace(temp, path)
    except BaseException:
        _remove(temp)
        raise
    sync_directory(path.parent)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace the file at `path` with `data` so that a crash leaves the old or the new file."""
    with atomic_replace(path) as temp:
        temp.write_bytes(data)


def sync_directory(path: Path) -> None:
    """fsync a directory: makes the names created, renamed or removed in it durable."""
    _fsync(path)


def _fsync_tree(path: Path) -> None:
    if not path.is_dir():
        _fsync(path)
        return
    for directory, _dirnames, filenames in os.walk(path):
        for name in filenames:
            _fsync(Path(directory, name))
        _fsync(Path(directory))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
