"""Turning `--model` into an MLX model directory: a path, a .gguf to convert once, a name in
the model dir, or (no --model) the provisioned default. Conversion and provisioning run
as `python -m models.gguf` / `python -m models.provision` subprocesses."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

from protocol.atomic_files import atomic_replace
from router.config import RouterConfig

logger = logging.getLogger(__name__)


class ModelNotFound(Exception):
    """--model names nothing servable, or converting / provisioning it failed."""


def gguf_command(src: Path | str, dest: Path | str, dtype: str | None = None) -> list[str]:
    """The converter's command line (the converter lives in the offline `models` package)."""
    argv = [sys.executable, "-m", "models.gguf", str(src), str(dest)]
    if dtype is not None:
        argv += ["--dtype", dtype]
    return argv


def provision_command(home: Path) -> list[str]:
    return [sys.executable, "-m", "models.provision", "--home", str(home)]


def _check_model_dir(path: Path) -> Path:
    if not (path / "config.json").is_file():
        raise ModelNotFound(f"{path} is not an MLX model directory (it has no config.json)")
    return path


def convert_once(src: Path, models_dir: Path) -> Path:
    """`<models_dir>/<stem>/`, converting `src` into it unless that was done before.

    The converter writes into a scratch directory that is renamed only on success, so an
    interrupted conversion is redone rather than served half-written.
    """
    dest = models_dir / src.stem
    if (dest / "config.json").is_file():
        logger.info("%s already converted in %s", src.name, dest)
        return dest
    models_dir.mkdir(parents=True, exist_ok=True)
    logger.info("converting %s into %s (once)", src, dest)
    with atomic_replace(dest) as scratch:
        returncode = subprocess.call(gguf_command(src, scratch), stdin=subprocess.DEVNULL)
        if returncode != 0:
            raise ModelNotFound(f"converting {src} failed (exit code {returncode}); see its output above")
    return _check_model_dir(dest)


def provision_default(home: Path) -> Path:
    """Fetch/convert the default model; the provisioner's last stdout line is its directory.

    Its stderr goes straight to the terminal: it is the progress the user watches.
    """
    argv = provision_command(home)
    logger.info("no --model given; provisioning the default model into %s", home)
    result = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, check=False)
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    if result.returncode != 0 or not lines:
        raise ModelNotFound(f"provisioning the default model failed (exit code {result.returncode}); "
                            "pass --model DIR_OR_GGUF to serve a model you have")
    return _check_model_dir(Path(lines[-1]))


def resolve_model(config: RouterConfig) -> tuple[str, Path]:
    """(model id, MLX model directory) for `config.model`; the id is the directory name."""
    if config.model is None:
        path = provision_default(config.home)
        return path.name, path
    candidate = Path(config.model).expanduser()
    if candidate.is_file() and candidate.suffix.lower() == ".gguf":
        path = convert_once(candidate.resolve(), config.models_dir)
    elif candidate.is_dir():
        path = _check_model_dir(candidate.resolve())
    elif candidate.exists():
        raise ModelNotFound(f"--model {config.model}: expected an MLX model directory or a .gguf file")
    elif "/" in config.model or candidate.suffix.lower() == ".gguf":
        raise ModelNotFound(f"--model {config.model}: no such file or directory")
    elif (config.models_dir / config.model).is_dir():
        path = _check_model_dir(config.models_dir / config.model)
    else:
        names = sorted(p.name for p in config.models_dir.glob("*") if p.is_dir() and not p.name.startswith("."))
        known = ", ".join(names) if names else "none"
        raise ModelNotFound(f"--model {config.model}: not a path, and no model of that name in "
                            f"{config.models_dir} (available: {known}); see --model-dir")
    return path.name, path
