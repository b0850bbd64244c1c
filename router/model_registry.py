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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol.context_window import declared_context_length
from protocol.served_quantization import served_quantized

logger = logging.getLogger(__name__)

# sentence-transformers' own files: an embedding model, whatever its architecture says
SENTENCE_TRANSFORMERS_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")
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
    # the window its config.json declares (a chat model's, before any worker loads it); None
    # until there is a config.json to read (a .gguf not converted yet, a model not fetched)
    context_length: int | None = None

    @property
    def needs_conversion(self) -> bool:
        return self.path.suffix.lower() == ".gguf"

    @property
    def needs_provision(self) -> bool:
        """A catalog model listed before it is on disk: fetched by name on first load."""
        return not self.path.exists()


def model_kind(config: dict[str, Any], model_dir: Path | None = None) -> str:
    """chat LLM, embedding model or reranker (cross-encoder), from its config.json; a
    decoder LLM with sentence-transformers' files beside it (Qwen3-Embedding: pooled
    on its last token) is an embedding model too."""
    architectures = " ".join(config.get("architectures") or [])
    if "ForSequenceClassification" in architectures:
        return "reranker"
    if config.get("model_type") in EMBEDDING_TYPES:
        return "embedding"
    if model_dir is not None and any((model_dir / name).is_file() for name in SENTENCE_TRANSFORMERS_FILES):
        return "embedding"
    return "chat"


def _safetensors_header(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length))


_DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "U8": 1, "I8": 1, "F64": 8, "I64": 8}


def _layer_layout(quant: dict[str, Any], module: str) -> tuple[int, int, str]:
    layer = quant.get(module) if isinstance(quant.get(module), dict) else {}
    return (int(layer.get("bits", quant.get("bits", 4))), int(layer.get("group_size", quant.get("group_size", 64))),
            str(layer.get("mode", quant.get("mode", "affine"))))


def estimate_weights_bytes(model_dir: Path, config: dict[str, Any], dequantize_all: bool = False) -> int:
    """Bytes of weights once loaded. On a CPU backend the worker keeps the quantized
    layers its kernels serve (protocol.served_quantization) as stored, bfloat16 scales
    widened to float32, and serves everything else as float32 (4 bytes per element; all
    of it with `dequantize_all`, the dtype = "float32" setting); on macOS the checkpoint's
    own sizes. Read from safetensors headers only (cheap)."""
    as_fp32 = sys.platform != "darwin"
    quant = config.get("quantization") or {}
    if not isinstance(quant, dict):
        quant = {}
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
            module, _, leaf = name.rpartition(".")
            kept = quant and not dequantize_all and served_quantized(*_layer_layout(quant, module))
            if not as_fp32:
                total += numel * itemsize
            elif leaf in ("scales", "biases") and quant:
                if kept:
                    total += numel * (2 if info["dtype"] == "F16" else 4)
                # else: folded into the dequantized weight
            elif info["dtype"] == "U32" and quant:
                bits = _layer_layout(quant, module)[0]
                total += numel * 4 if kept else numel * 32 // bits * 4  # values per word: 32 / bits
            else:
                total += numel * 4
    return total


def _entry_for_dir(model_id: str, path: Path, dequantize_all: bool = False) -> ModelEntry | None:
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    kind = model_kind(config, path)
    return ModelEntry(model_id, path, kind, estimate_weights_bytes(path, config, dequantize_all),
                      declared_context_length(config) if kind == "chat" else None)


# a provisionable model's estimate before its files exist (all-MiniLM-L6-v2 serves ~90 MB)
UNFETCHED_WEIGHTS_BYTES = 128 << 20


def provisioned_entry(model_id: str, models_dir: Path, kind: str) -> ModelEntry:
    """The entry of a model mlxd can pull, by its directory name in `models_dir`: listed
    before it is fetched (`needs_provision`), with a nominal size until then."""
    return ModelEntry(model_id, models_dir / model_id, kind, UNFETCHED_WEIGHTS_BYTES)


def discover(models_dir: Path, dequantize_all: bool = False) -> dict[str, ModelEntry]:
    """Every model in `models_dir`: subdirectories with a config.json, and .gguf files
    (a converted directory of the same name wins over its .gguf); `dequantize_all`
    estimates them served in float32 (the worker's dtype setting is not auto)."""
    found: dict[str, ModelEntry] = {}
    if not models_dir.is_dir():
        return found
    for child in sorted(models_dir.iterdir()):
        if child.name.startswith("."):
            continue
        if child.is_dir() and (child / "config.json").is_file():
            entry = _entry_for_dir(child.name, child, dequantize_all)
            if entry is not None:
                found[entry.id] = entry
    for gguf in sorted(models_dir.glob("*.gguf")):
        if gguf.stem not in found:
            # size on disk as the estimate until it is converted: kept quantized (5-bit
            # blocks widen to 8) or dequantized
            factor = 4 if dequantize_all else 2
            found[gguf.stem] = ModelEntry(gguf.stem, gguf, "chat", gguf.stat().st_size * factor)
    return found


def servable(models_dir: Path, given: Mapping[str, Path], embedding_model: str,
             dequantize_all: bool = False) -> dict[str, ModelEntry]:
    """Every model a service can serve: those in `models_dir`, those `given` on the command
    line (which win a name both have), and `embedding_model`, listed before it is fetched
    (on its first load) unless it is there already."""
    found = discover(models_dir, dequantize_all)
    for model_id, path in given.items():
        found[model_id] = entry_for(model_id, path, dequantize_all)
    if embedding_model and embedding_model not in found:
        found[embedding_model] = provisioned_entry(embedding_model, models_dir, "embedding")
    return found


def entry_for(model_id: str, path: Path, dequantize_all: bool = False) -> ModelEntry:
    """An entry for an explicitly given model directory (e.g. `--model /some/dir`)."""
    entry = _entry_for_dir(model_id, path, dequantize_all)
    if entry is None:
        raise ValueError(f"{path} is not an MLX model directory (no readable config.json)")
    return entry
