"""What the models directory holds, as `mlxd models list` shows it: each model's size on
disk, kind and quantization, read from its files (config.json, safetensors headers), and
the pulls left unfinished there. Reads files only: no MLX, no running service."""

from __future__ import annotations

import json
import os
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from router.model_registry import discover

# models/pull.py's names (the router does not import the model tools): a pull in progress
# lives in MODELS/.pull-NAME, and a pulled directory records its source in this file.
STAGING_PREFIX = ".pull-"
PULL_MARKER = ".mlxd-pull.json"
DTYPE_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64", "I8": "int8",
               "U8": "uint8", "U32": "uint32", "F8_E4M3": "float8_e4m3", "F8_E5M2": "float8_e5m2"}


@dataclass(frozen=True)
class ModelOnDisk:
    """A model in the models directory: a directory with a config.json, or a .gguf file
    that is converted on first use (the service's discovery finds the same ones)."""

    name: str
    path: Path
    size_bytes: int
    kind: str  # chat | embedding | reranker
    quantization: str  # "4-bit g64", a weight dtype such as "bfloat16", or "gguf"
    source: str | None  # where `mlxd pull` fetched it from, when it did


@dataclass(frozen=True)
class PartialPull:
    """A pull that stopped before its end: the next run of the same pull continues it."""

    name: str
    path: Path
    size_bytes: int


def scan(models_dir: Path) -> list[ModelOnDisk]:
    models = []
    for entry in discover(models_dir).values():
        if entry.needs_conversion:
            models.append(ModelOnDisk(entry.id, entry.path, entry.path.stat().st_size, entry.kind,
                                      "gguf", None))
            continue
        config = _read_json(entry.path / "config.json") or {}
        models.append(ModelOnDisk(entry.id, entry.path, size_on_disk(entry.path), entry.kind,
                                  quantization_of(entry.path, config), _source(entry.path)))
    return models


def partial_pulls(models_dir: Path) -> list[PartialPull]:
    if not models_dir.is_dir():
        return []
    return [PartialPull(p.name[len(STAGING_PREFIX):], p, size_on_disk(p))
            for p in sorted(models_dir.glob(f"{STAGING_PREFIX}*")) if p.is_dir()]


def size_on_disk(path: Path) -> int:
    """Bytes of the files under `path` (a file linked twice counts once)."""
    if path.is_file():
        return path.stat().st_size
    seen: set[tuple[int, int]] = set()
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            info = os.lstat(os.path.join(directory, name))
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_size
    return total


def quantization_of(model_dir: Path, config: dict[str, Any]) -> str:
    """"BITS-bit gGROUP" from config.json's `quantization` (mlx-lm's; also written by the GGUF
    importer), else the dtype holding most of the weights' bytes, else config.json's dtype."""
    quantization = config.get("quantization")
    if isinstance(quantization, dict) and "bits" in quantization:
        text = f"{quantization['bits']}-bit g{quantization.get('group_size', '?')}"
        mode = quantization.get("mode")
        return f"{mode} {text}" if mode and mode != "affine" else text
    bytes_by_dtype: Counter[str] = Counter()
    for file in sorted(model_dir.glob("*.safetensors")):
        for name, info in _safetensors_header(file).items():
            if name != "__metadata__" and isinstance(info, dict):
                start, end = info.get("data_offsets", (0, 0))
                bytes_by_dtype[info.get("dtype", "?")] += end - start
    if bytes_by_dtype:
        dtype = bytes_by_dtype.most_common(1)[0][0]
        return DTYPE_NAMES.get(dtype, dtype.lower())
    return str(config.get("torch_dtype") or config.get("dtype") or "-")


def _safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file ({} when it cannot be read)."""
    try:
        with path.open("rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            return json.loads(file.read(length))
    except (OSError, ValueError, struct.error):
        return {}


def _source(model_dir: Path) -> str | None:
    marker = _read_json(model_dir / PULL_MARKER)
    return marker.get("source") if marker else None


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
