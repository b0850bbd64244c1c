"""Convert a GGUF file into an mlx-lm model directory (`python -m models.gguf SRC DEST`).

Owns the architecture checks, config.json from GGUF metadata, the weight files and the
atomic write of the directory; tensors and tokenizer live in gguf_tensors/gguf_tokenizer.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from gguf import GGUFReader

from models.gguf_tensors import (
    DTYPES,
    GROUP_SIZE,
    check_tensor_type,
    convert_tensor,
    find_tensor,
    logical_shape,
    mlx_name,
)
from models.gguf_tokenizer import end_of_generation_ids, tokenizer_files
from models.progress import Progress

from protocol.atomic_files import atomic_replace

logger = logging.getLogger(__name__)

# GGUF general.architecture -> the HF class name mlx-lm dispatches on (via model_type).
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
# Architectures whose Q/K rows llama.cpp's converter permutes for its "normal" rope.
# qwen2/qwen3 use llama.cpp's NEOX rope and are stored in HF order.
ROPE_PERMUTED_ARCHITECTURES = frozenset({"llama"})
# Leaves directory-level shards under the size mlx-lm itself writes.
MAX_SHARD_BYTES = 5 << 30
ROPE_FREQS_TENSOR = "rope_freqs.weight"
# (low_freq_factor, high_freq_factor, original context) of published llama3 ropes.
_LLAMA3_ROPE_CANDIDATES = ((1.0, 4.0, 8192),)


def read_metadata(reader: GGUFReader) -> dict[str, Any]:
    """Every GGUF key/value as plain Python values (lists for arrays)."""
    return {name: field.contents() for name, field in reader.fields.items()}


def _float32(value: float) -> float:
    # GGUF stores float32; its shortest repr keeps 1e-05 from becoming 9.99999e-06.
    return float(str(np.float32(value)))


def _require(metadata: dict[str, Any], key: str) -> Any:
    if key not in metadata:
        raise ValueError(f"GGUF metadata key {key!r} is missing")
    return metadata[key]


def _llama3_rope_scaling(
    factors: np.ndarray, head_dim: int, base: float
) -> dict[str, Any]:
    """Recover HF's llama3 rope_scaling from llama.cpp's per-frequency `rope_freqs`.

    llama.cpp bakes the llama3 frequency smoothing into one divisor per frequency; mlx-lm
    wants the four parameters that produced it, so known parameter sets are tried.
    """
    factor = float(factors.max())
    inv_freq = 1.0 / base ** (np.arange(0, head_dim, 2) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    for low, high, original in _LLAMA3_ROPE_CANDIDATES:
        smooth = np.clip((original / wavelen - low) / (high - low), 0.0, 1.0)
        expected = 1 / ((1 - smooth) / factor + smooth)
        if np.allclose(expected, factors, rtol=1e-3):
            return {
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": low,
                "high_freq_factor": high,
                "original_max_position_embeddings": original,
            }
    raise ValueError(
        f"GGUF tensor {ROPE_FREQS_TENSOR!r} holds rope frequency factors that match no "
        "known llama3 rope scaling"
    )


def _rope_scaling(
    metadata: dict[str, Any], arch: str, reader: GGUFReader, head_dim: int, base: float
) -> dict[str, Any] | None:
    if (freqs := find_tensor(reader, ROPE_FREQS_TENSOR)) is not None:
        return _llama3_rope_scaling(np.asarray(freqs.data, np.float64), head_dim, base)
    kind = metadata.get(f"{arch}.rope.scaling.type", "none")
    factor = metadata.get(f"{arch}.rope.scaling.factor")
    if kind == "none" and (linear := metadata.get(f"{arch}.rope.scale_linear")):
        kind, factor = "linear", linear
    if kind == "none" or (kind == "linear" and factor in (None, 0, 1.0)):
        return None
    if kind == "linear":
        return {"type": "linear", "factor": _float32(factor)}
    if kind == "yarn":
        scaling: dict[str, Any] = {"type": "yarn", "factor": _float32(factor)}
        original = metadata.get(f"{arch}.rope.scaling.original_context_length")
        if original:
            scaling["original_max_position_embeddings"] = int(original)
        for key in ("beta_fast", "beta_slow"):
            if (value := metadata.get(f"{arch}.rope.scaling.yarn_{key}")) is not None:
                scaling[key] = _float32(value)
        return scaling
    raise ValueError(f"GGUF rope scaling type {kind!r} ({arch}) is not supported")


def model_config(metadata: dict[str, Any], reader: GGUFReader) -> dict[str, Any]:
    """config.json for mlx-lm, from the architecture's GGUF hyper-parameters."""
    arch = _require(metadata, "general.architecture")
    if arch not in ARCHITECTURES:
        supported = ", ".join(ARCHITECTURES)
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported (supported: {supported})"
        )
    hidden = int(_require(metadata, f"{arch}.embedding_length"))
    num_heads = int(_require(metadata, f"{arch}.attention.head_count"))
    num_kv_heads = int(metadata.get(f"{arch}.attention.head_count_kv", num_heads))
    head_dim = int(metadata.get(f"{arch}.attention.key_length", hidden // num_heads))
    value_dim = int(metadata.get(f"{arch}.attention.value_length", head_dim))
    rope_dim = int(metadata.get(f"{arch}.rope.dimension_count", head_dim))
    if value_dim != head_dim or rope_dim != head_dim:
        raise ValueError(
            f"GGUF {arch} with key/value/rope dims {head_dim}/{value_dim}/{rope_dim} is "
            "not supported: mlx-lm needs them equal"
        )
    if arch == "qwen2" and head_dim * num_heads != hidden:
        raise ValueError(f"GGUF qwen2 head_dim {head_dim} != hidden/heads: unsupported")
    embedding = find_tensor(reader, "token_embd.weight")
    if embedding is None:
        raise ValueError("GGUF tensor 'token_embd.weight' is missing")
    base = _float32(metadata.get(f"{arch}.rope.freq_base", 10000.0))
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "hidden_size": hidden,
        "intermediate_size": int(_require(metadata, f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(_require(metadata, f"{arch}.block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": _float32(_require(metadata, f"{arch}.attention.layer_norm_rms_epsilon")),
        "rope_theta": base,
        # Q/K rows are un-permuted to HF order, so mlx-lm's default rope applies.
        "rope_traditional": False,
        "rope_scaling": _rope_scaling(metadata, arch, reader, head_dim, base),
        "max_position_embeddings": int(metadata.get(f"{arch}.context_length", 4096)),
        "vocab_size": logical_shape(embedding)[0],
        "tie_word_embeddings": find_tensor(reader, "output.weight") is None,
        "attention_bias": find_tensor(reader, "blk.0.attn_q.bias") is not None,
        "mlp_bias": False,
    }
    return config


def _quantization_config(bits_by_module: dict[str, int]) -> dict[str, Any] | None:
    """mlx-lm's quantization entry; modules off the most common width are listed
    by path (e.g. SmolLM2's Q8_0 embedding among Q4_1 layers)."""
    if not bits_by_module:
        return None
    default_bits = Counter(bits_by_module.values()).most_common(1)[0][0]
    quantization: dict[str, Any] = {"group_size": GROUP_SIZE, "bits": default_bits}
    for module, bits in sorted(bits_by_module.items()):
        if bits != default_bits:
            quantization[module] = {"group_size": GROUP_SIZE, "bits": bits}
    return quantization


def _save_weights(directory: Path, weights: dict[str, mx.array]) -> None:
    """model.safetensors, or model-0000N-of-0000M.safetensors plus an index."""
    shards: list[dict[str, mx.array]] = [{}]
    shard_bytes = 0
    for name in sorted(weights):
        size = weights[name].nbytes
        if shards[-1] and shard_bytes + size > MAX_SHARD_BYTES:
            shards.append({})
            shard_bytes = 0
        shards[-1][name] = weights[name]
        shard_bytes += size
    if len(shards) == 1:
        mx.save_safetensors(str(directory / "model.safetensors"), shards[0], {"format": "mlx"})
        return
    weight_map: dict[str, str] = {}
    for index, shard in enumerate(shards, start=1):
        file_name = f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        mx.save_safetensors(str(directory / file_name), shard, {"format": "mlx"})
        weight_map.update({name: file_name for name in shard})
    total = sum(array.nbytes for array in weights.values())
    index_text = json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    (directory / "model.safetensors.index.json").write_text(index_text, encoding="utf-8")


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def convert_gguf(
    src: Path,
    dest: Path,
    *,
    dtype: str = "native",
    progress: Progress | None = None,
) -> Path:
    """Write an mlx-lm model directory for the GGUF at `src` to `dest`; return `dest`.

    The directory is built under a hidden sibling and renamed into place, so `dest`
    either holds a complete model or does not exist. `dest` must be absent or empty.
    Raises ValueError naming the architecture, tensor type or tensor that cannot be
    converted, before anything is written.
    """
    src, dest = Path(src), Path(dest)
    if dtype != "native" and dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of native, {', '.join(DTYPES)}")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise FileExistsError(f"destination {dest} exists and is not empty")

    reader = GGUFReader(src)
    metadata = read_metadata(reader)
    config = model_config(metadata, reader)
    arch = config["model_type"]
    tensors = [t for t in reader.tensors if t.name != ROPE_FREQS_TENSOR]
    for tensor in tensors:
        mlx_name(tensor.name)
        check_tensor_type(tensor)
    files = tokenizer_files(metadata, context_length=config["max_position_embeddings"])

    rope_heads: dict[str, int] = {}
    if arch in ROPE_PERMUTED_ARCHITECTURES:
        rope_heads = {
            "attn_q": config["num_attention_heads"],
            "attn_k": config["num_key_value_heads"],
        }
    weights: dict[str, mx.array] = {}
    bits_by_module: dict[str, int] = {}
    for done, tensor in enumerate(tensors, start=1):
        part = tensor.name.split(".")[2] if tensor.name.startswith("blk.") else ""
        converted = convert_tensor(tensor, dtype=dtype, rope_heads=rope_heads.get(part))
        # Evaluated now: a lazy cast would keep every tensor's float32 source alive until
        # the save (a 1.5B model then peaks at ~3x the memory of its output).
        mx.eval(*converted.arrays.values())
        weights.update(converted.arrays)
        if converted.bits is not None:
            bits_by_module[converted.module] = converted.bits
        if progress is not None:
            progress("tensors", done, len(tensors))

    if (quantization := _quantization_config(bits_by_module)) is not None:
        config["quantization"] = quantization
        config["quantization_config"] = quantization
    eos_ids = end_of_generation_ids(metadata)
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    generation = {"eos_token_id": eos_ids[0] if len(eos_ids) == 1 else eos_ids}
    if bos is not None:
        config["bos_token_id"] = generation["bos_token_id"] = int(bos)
    config["eos_token_id"] = generation["eos_token_id"]

    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_dir() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} exists and is not empty; choose another DEST_DIR or remove it")
    with atomic_replace(dest) as partial:
        partial.mkdir()
        _save_weights(partial, weights)
        _write_json(partial / "config.json", config)
        _write_json(partial / "generation_config.json", generation)
        for name, text in files.items():
            (partial / name).write_text(text, encoding="utf-8")
    logger.info(
        "converted %s (%s, %d tensors, dtype %s) to %s", src, arch, len(tensors), dtype, dest
    )
    return dest


def main(argv: list[str] | None = None) -> int:
    """CLI: progress on stderr, the destination directory as the last stdout line."""
    parser = argparse.ArgumentParser(prog="python -m models.gguf", description=__doc__)
    parser.add_argument("src", type=Path, help="GGUF file to convert")
    parser.add_argument("dest", type=Path, help="model directory to create")
    parser.add_argument("--dtype", default="native", choices=["native", *DTYPES])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s convert %(levelname)s %(message)s")

    def report(stage: str, done: int, total: int) -> None:
        sys.stderr.write(f"converting {done}/{total} {stage}\n")

    try:
        dest = convert_gguf(args.src, args.dest, dtype=args.dtype, progress=report)
    except (ValueError, FileExistsError, FileNotFoundError) as error:
        sys.stderr.write(f"error: {error}\n")
        return 2
    print(dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
