"""Turning `--model` into an MLX model directory: a path, a .gguf to convert once, a name in
the model dir, a name mlxd can pull (its catalog), or (no --model) the provisioned default.
Conversion and provisioning run as `python -m models.gguf` / `python -m models.provision`
subprocesses: the router never imports the model tools."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

from protocol.atomic_files import atomic_replace
from router.config import RouterConfig

logger = logging.getLogger(__name__)

# models.provision's exit status for a name its catalog lacks: a usage error, as argparse
# exits (it has then printed the names it knows); any other failure exits 1.
UNKNOWN_NAME_EXIT = 2


class ModelNotFound(Exception):
    """--model names nothing servable, or converting / provisioning it failed."""


class UnknownName(ModelNotFound):
    """The provisioner's catalog has no model of that name (it listed the ones it has)."""


def gguf_command(src: Path | str, dest: Path | str, dtype: str | None = None) -> list[str]:
    """The converter's command line (the converter lives in the offline `models` package)."""
    argv = [sys.executable, "-m", "models.gguf", str(src), str(dest)]
    if dtype is not None:
        argv += ["--dtype", dtype]
    return argv


def provision_command(home: Path, name: str | None = None, models_dir: Path | None = None) -> list[str]:
    """The provisioner's command line: the default model, or catalog model `name`."""
    argv = [sys.executable, "-m", "models.provision", "--home", str(home)]
    if models_dir is not None:
        argv += ["--models-dir", str(models_dir)]
    return argv if name is None else [*argv, name]


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


def provision(home: Path, name: str | None = None, models_dir: Path | None = None) -> Path:
    """Fetch/convert a catalog model (the default one when `name` is None) unless done
    before; the provisioner's last stdout line is its directory.

    Its stderr goes straight to the terminal: it is the progress the user watches.
    Raises UnknownName for a name the catalog lacks, ModelNotFound when it fails.
    """
    argv = provision_command(home, name=name, models_dir=models_dir)
    what = "the default model" if name is None else name
    logger.info("provisioning %s into %s", what, models_dir or home / "models")
    result = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, check=False)
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    if name is not None and result.returncode == UNKNOWN_NAME_EXIT:
        raise UnknownName(f"{name!r} is not a model mlxd can pull (the known names are listed above)")
    if result.returncode != 0 or not lines:
        raise ModelNotFound(f"provisioning {what} failed (exit code {result.returncode}); see its output "
                            "above, or pass --model DIR_OR_GGUF to serve a model you have")
    return _check_model_dir(Path(lines[-1]))


def provision_default(home: Path) -> Path:
    """The default model's directory under HOME/models, provisioned if needed."""
    logger.info("no --model given; using the default model")
    return provision(home)


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
        path = _pull_or_explain(config.model, config)
    return path.name, path


def _pull_or_explain(name: str, config: RouterConfig) -> Path:
    """A bare name found nowhere on disk: pulled if mlxd knows it, else an error that
    lists both the models on disk and (through the provisioner) the ones it can pull."""
    try:
        return provision(config.home, name, config.models_dir)
    except UnknownName:
        names = sorted(p.name for p in config.models_dir.glob("*") if p.is_dir() and not p.name.startswith("."))
        known = ", ".join(names) if names else "none"
        raise ModelNotFound(f"--model {name}: not a path, not a name mlxd can pull, and no model of "
                            f"that name in {config.models_dir} (available: {known}); see --model-dir") from None
