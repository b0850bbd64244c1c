"""Which models exist: the model directory scanned into id -> entry, with each model's kind
and an estimate of the memory it needs once loaded.

Names from requests are looked up in this table, never turned into paths: `..`, an
absolute path or anything else not discovered is simply unknown (404).
"""

from __future__ import annotations

import json
import logging
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

EMBEDDING_TYPES = {"bert", "roberta", "xlm-roberta", "nomic_bert", "distilbert", "modernbert"}
# Python + MLX + tokenizer in a worker before any weights
RUNTIME_OVERHEAD_BYTES = 300 << 20


@dataclass(frozen=True)
class ModelEntry:
    """A servable model: where it is, what it is, how big it is served."""

    id: str
    path: Path  # an MLX model directory, or a .gguf file converted on first use
    kind: str  # "chat" | "embedding" | "reranker"
    weights_bytes: int  # estimated resident weights once loaded (fp32 on a CPU backend)

    @property
    def needs_conversion(self) -> bool:
        return self.path.suffix.lower() == ".gguf"


def model_kind(config: dict[str, Any]) -> str:
    """chat LLM, embedding model or reranker (cross-encoder), from its config.json."""
    architectures = " ".join(config.get("architectures") or [])
    if "ForSequenceClassification" in architectures:
        return "reranker"
    if config.get("model_type") in EMBEDDING_TYPES:
        return "embedding"
    return "chat"


def _safetensors_header(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length))


_DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "U8": 1, "I8": 1, "F64": 8, "I64": 8}


def estimate_weights_bytes(model_dir: Path, config: dict[str, Any]) -> int:
    """Bytes of weights once loaded. On a CPU backend the worker serves float32, so
    quantized and half-precision tensors count at 4 bytes per element; on macOS the
    checkpoint's own sizes. Read from safetensors headers only (cheap)."""
    as_fp32 = sys.platform != "darwin"
    quant = config.get("quantization") or {}
    default_bits = quant.get("bits", 4) if isinstance(quant, dict) else 4
    total = 0
    for file in sorted(model_dir.glob("*.safetensors")):
        try:
            header = _safetensors_header(file)
        except (OSError, ValueError, struct.error):
            total += file.stat().st_size
            continue
        for name, info in header.items():
            if name == "__metadata__":
                continue
            numel = 1
            for d in info["shape"]:
                numel *= d
            itemsize = _DTYPE_BYTES.get(info["dtype"], 4)
            if not as_fp32:
                total += numel * itemsize
            elif name.endswith((".scales", ".biases")) and info["dtype"] != "F32" and quant:
                continue  # folded into the dequantized weight
            elif info["dtype"] == "U32" and quant:
                module = name.rsplit(".", 1)[0]
                layer = quant.get(module) if isinstance(quant.get(module), dict) else {}
                bits = layer.get("bits", default_bits)
                total += numel * (32 // bits) * 4
            else:
                total += numel * 4
    return total


def _entry_for_dir(model_id: str, path: Path) -> ModelEntry | None:
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return ModelEntry(model_id, path, model_kind(config), estimate_weights_bytes(path, config))


def discover(models_dir: Path) -> dict[str, ModelEntry]:
    """Every model in `models_dir`: subdirectories with a config.json, and .gguf files
    (a converted directory of the same name wins over its .gguf)."""
    found: dict[str, ModelEntry] = {}
    if not models_dir.is_dir():
        return found
    for child in sorted(models_dir.iterdir()):
        if child.name.startswith("."):
            continue
        if child.is_dir() and (child / "config.json").is_file():
            entry = _entry_for_dir(child.name, child)
            if entry is not None:
                found[entry.id] = entry
    for gguf in sorted(models_dir.glob("*.gguf")):
        if gguf.stem not in found:
            # size on disk as the estimate until it is converted
            found[gguf.stem] = ModelEntry(gguf.stem, gguf, "chat", gguf.stat().st_size * 4)
    return found


def entry_for(model_id: str, path: Path) -> ModelEntry:
    """An entry for an explicitly given model directory (e.g. `--model /some/dir`)."""
    entry = _entry_for_dir(model_id, path)
    if entry is None:
        raise ValueError(f"{path} is not an MLX model directory (no readable config.json)")
    return entry
