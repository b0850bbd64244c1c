"""GGUF -> MLX conversion: tiny random GGUFs in every supported tensor type, converted,
loaded by mlx-lm and checked against a numpy forward on the GGUF's own (llama.cpp
layout) weights with llama.cpp's rope for the architecture."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import Counter
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from mlx_lm.utils import load_model

from models.gguf import convert_gguf
from models.gguf_tensors import DEQUANTIZED_TYPES, raw_rows, repack_native
from models.gguf_tokenizer import build_tokenizer

REPO = Path(__file__).resolve().parents[2]
NUM_LAYERS = 2
NUM_HEADS = 4
NUM_KV_HEADS = 2
ROPE_BASE = 10000.0
EPS = 1e-5
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] + "
    "'<|im_end|>\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{'<|im_start|>assistant\n'}}{% endif %}"
)
PROMPT_IDS = [1, 70, 280, 75, 3, 290, 120, 2, 33, 260, 12]

QUANTIZABLE = {Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.BF16}
# Byte offset and magnitude of each fp16 super-block field of the K-quants: d, then
# dmin where the type has one, sized so random blocks give zero-mean weights of ~0.1-1
# (a mean offset would swamp the rope and make the rope-layout check toothless).
K_SCALE_FIELDS = {
    Q.Q2_K: ((80, 1e-2), (82, 1.5e-2)),
    Q.Q3_K: ((108, 3e-3),),
    Q.Q4_K: ((0, 1e-3), (2, 7.5e-3)),
    Q.Q5_K: ((0, 5e-4), (2, 7.75e-3)),
    Q.Q6_K: ((208, 1e-4),),
}
ALL_TYPES = [
    Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q5_0, Q.Q5_1,
    Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K,
]


# ---------------------------------------------------------------- tiny vocab


def byte_alphabet() -> list[str]:
    """GPT-2's byte -> printable character table, in byte order."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def tiny_vocab(num_merges: int = 40) -> tuple[list[str], list[int], list[str]]:
    """Specials + 256 byte tokens + merges learnt greedily from a short text."""
    alphabet = byte_alphabet()
    corpus = (
        "the cat sat on the mat and the hat that the rat ate in the heat; hello world, "
        "this is a tiny tokenizer for these tests with merges learnt greedily "
    ) * 3
    words = [[alphabet[b] for b in (" " + w).encode()] for w in corpus.split()]
    tokens = SPECIALS + alphabet
    merges: list[str] = []
    for _ in range(num_merges):
        pairs = Counter(p for w in words for p in zip(w, w[1:], strict=False))
        if not pairs:
            break
        (left, right), _ = pairs.most_common(1)[0]
        merges.append(f"{left} {right}")
        tokens.append(left + right)
        for word in words:
            i = 0
            while i < len(word) - 1:
                if word[i] == left and word[i + 1] == right:
                    word[i : i + 2] = [left + right]
                i += 1
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
    return tokens, types, merges


# ---------------------------------------------------------------- tiny GGUFs


def dims_for(qtype: Q) -> tuple[int, int]:
    """(hidden, intermediate): block types need rows that hold whole blocks."""
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    hidden = max(64, block)
    return hidden, 2 * hidden


def random_k_blocks(rng: np.random.Generator, rows: int, cols: int, qtype: Q) -> np.ndarray:
    """Valid K-quant blocks: random bytes with sane fp16 super-block scales."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for offset, magnitude in K_SCALE_FIELDS[qtype]:
        scale = rng.uniform(0.5, 1.5, (rows, cols // block)) * magnitude
        data[..., offset : offset + 2] = scale.astype(np.float16)[..., None].view(np.uint8)
    return data.reshape(rows, -1)


def add_matrix(writer: gguf.GGUFWriter, name: str, values: np.ndarray, qtype: Q,
               rng: np.random.Generator) -> None:
    if qtype == Q.F32:
        writer.add_tensor(name, values.astype(np.float32))
    elif qtype == Q.F16:
        writer.add_tensor(name, values.astype(np.float16))
    elif qtype in QUANTIZABLE:
        writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    elif qtype in K_SCALE_FIELDS:
        rows, cols = values.shape
        writer.add_tensor(name, random_k_blocks(rng, rows, cols, qtype), raw_dtype=qtype)
    else:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        rows, cols = values.shape
        raw = rng.integers(0, 256, (rows, cols // block * size), dtype=np.uint8)
        writer.add_tensor(name, raw, raw_dtype=qtype)


def write_tiny_gguf(
    path: Path,
    arch: str,
    qtype: Q,
    *,
    embed_type: Q | None = None,
    tokenizer_model: str = "gpt2",
    pre: str | None = None,
    rope_freqs: np.ndarray | None = None,
    extra_tensor: str | None = None,
    add_bos: bool | None = False,
    seed: int = 0,
) -> Path:
    """A 2-layer random `arch` model; qwen2 has its own output matrix, the others tie
    it to the embedding; qwen2 has Q/K/V biases, qwen3 per-head Q/K norms."""
    rng = np.random.default_rng(seed)
    hidden, intermediate = dims_for(qtype if embed_type is None else max(
        (qtype, embed_type), key=lambda t: gguf.GGML_QUANT_SIZES[t][0]))
    head_dim = hidden // NUM_HEADS
    tokens, types, merges = tiny_vocab()
    vocab = len(tokens)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(intermediate)
    writer.add_block_count(NUM_LAYERS)
    writer.add_head_count(NUM_HEADS)
    writer.add_head_count_kv(NUM_KV_HEADS)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(ROPE_BASE)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_tokenizer_pre(pre or ("smollm" if arch == "llama" else "qwen2"))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    writer.add_chat_template(CHAT_TEMPLATE)

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / math.sqrt(cols) * 2).astype(np.float32)

    def vector(n: int, mean: float) -> np.ndarray:
        return (mean + 0.1 * rng.standard_normal(n)).astype(np.float32)

    add_matrix(writer, "token_embd.weight", matrix(vocab, hidden),
               qtype if embed_type is None else embed_type, rng)
    writer.add_tensor("output_norm.weight", vector(hidden, 1.0))
    if arch == "qwen2":
        add_matrix(writer, "output.weight", matrix(vocab, hidden), qtype, rng)
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    kv = NUM_KV_HEADS * head_dim
    for layer in range(NUM_LAYERS):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", vector(hidden, 1.0))
        writer.add_tensor(f"{prefix}.ffn_norm.weight", vector(hidden, 1.0))
        for part, rows, cols in (
            ("attn_q", hidden, hidden), ("attn_k", kv, hidden), ("attn_v", kv, hidden),
            ("attn_output", hidden, hidden), ("ffn_gate", intermediate, hidden),
            ("ffn_up", intermediate, hidden), ("ffn_down", hidden, intermediate),
        ):
            add_matrix(writer, f"{prefix}.{part}.weight", matrix(rows, cols), qtype, rng)
        if arch == "qwen2":
            for part, rows in (("attn_q", hidden), ("attn_k", kv), ("attn_v", kv)):
                writer.add_tensor(f"{prefix}.{part}.bias", vector(rows, 0.0))
        if arch == "qwen3":
            writer.add_tensor(f"{prefix}.attn_q_norm.weight", vector(head_dim, 1.0))
            writer.add_tensor(f"{prefix}.attn_k_norm.weight", vector(head_dim, 1.0))
    if extra_tensor is not None:
        writer.add_tensor(extra_tensor, vector(hidden, 0.0))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# ---------------------------------------------------------------- reference forward


def gguf_weights(path: Path) -> dict[str, np.ndarray]:
    """Every tensor dequantized by gguf-py, in the file's (llama.cpp) layout."""
    reader = gguf.GGUFReader(path)
    return {
        t.name: gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
        for t in reader.tensors
    }


def rms_norm(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * weight


def llama_cpp_rope(x: np.ndarray, mode: str, freq_factors: np.ndarray | None) -> np.ndarray:
    """ggml's rope on (positions, heads, head_dim): "norm" rotates adjacent pairs
    (2i, 2i+1), "neox" rotates (i, i + head_dim/2); angle pos * base^(-2i/d) / factor."""
    positions, _, dim = x.shape
    freqs = ROPE_BASE ** (-np.arange(0, dim, 2) / dim)
    if freq_factors is not None:
        freqs = freqs / freq_factors
    angle = np.arange(positions)[:, None, None] * freqs[None, None, :]
    cos, sin = np.cos(angle), np.sin(angle)
    if mode == "norm":
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x[..., : dim // 2], x[..., dim // 2 :]
    ra, rb = a * cos - b * sin, a * sin + b * cos
    if mode == "norm":
        return np.stack([ra, rb], axis=-1).reshape(x.shape)
    return np.concatenate([ra, rb], axis=-1)


def reference_logits(w: dict[str, np.ndarray], ids: list[int], rope_mode: str) -> np.ndarray:
    x = w["token_embd.weight"][ids]
    positions = len(ids)
    freq_factors = w.get("rope_freqs.weight")
    for layer in range(NUM_LAYERS):
        p = f"blk.{layer}."
        h = rms_norm(x, w[p + "attn_norm.weight"])
        q, k, v = (
            h @ w[p + f"attn_{n}.weight"].T + w.get(p + f"attn_{n}.bias", 0.0) for n in "qkv"
        )
        head_dim = q.shape[-1] // NUM_HEADS
        q = q.reshape(positions, NUM_HEADS, head_dim)
        k = k.reshape(positions, NUM_KV_HEADS, head_dim)
        if p + "attn_q_norm.weight" in w:
            q = rms_norm(q, w[p + "attn_q_norm.weight"])
            k = rms_norm(k, w[p + "attn_k_norm.weight"])
        q = llama_cpp_rope(q, rope_mode, freq_factors)
        k = llama_cpp_rope(k, rope_mode, freq_factors)
        v = v.reshape(positions, NUM_KV_HEADS, head_dim)
        repeat = NUM_HEADS // NUM_KV_HEADS
        k, v = np.repeat(k, repeat, axis=1), np.repeat(v, repeat, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(head_dim)
        scores += np.triu(np.full((positions, positions), -np.inf), k=1)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(positions, -1)
        x = x + attn @ w[p + "attn_output.weight"].T
        h = rms_norm(x, w[p + "ffn_norm.weight"])
        gate = h @ w[p + "ffn_gate.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ w[p + "ffn_up.weight"].T)) @ w[
            p + "ffn_down.weight"
        ].T
    x = rms_norm(x, w["output_norm.weight"])
    return x @ w.get("output.weight", w["token_embd.weight"]).T


def mlx_logits(model_dir: Path) -> np.ndarray:
    model, _ = load_model(model_dir)
    logits = model(mx.array([PROMPT_IDS]))
    return np.array(logits[0].astype(mx.float32)).astype(np.float64)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


# llama.cpp's rope per architecture (llama_model_rope_type): llama rotates adjacent
# pairs of its permuted rows, the qwens rotate halves of rows kept in HF order.
ROPE_MODES = {"llama": "norm", "qwen2": "neox", "qwen3": "neox"}
# float32 is exact up to summation order; native keeps fp16 scales / fp16 activations.
TOLERANCES = {"float32": 5e-4, "native": 2e-2, "float16": 5e-2, "bfloat16": 1e-1}
# Types with 16-value sub-blocks have no exact MLX layout: native requantizes them to
# 8 bits in groups of 32 (Q8_0's precision; its per-weight bound is tested in
# test_gguf_repack.py), which this tiny random model amplifies to up to ~5% (measured); the wrong-rope check below still sits far above it.
REQUANTIZED_TOLERANCE = 8e-2


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("dtype", ["float32", "native"])
@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_logits_match_llama_cpp_layout_reference(
    tmp_path: Path, arch: str, qtype: Q, dtype: str
) -> None:
    src = write_tiny_gguf(tmp_path / "m.gguf", arch, qtype)
    dest = convert_gguf(src, tmp_path / "model", dtype=dtype)
    weights = gguf_weights(src)
    got = mlx_logits(dest)
    tolerance = TOLERANCES[dtype]
    if dtype == "native" and qtype in DEQUANTIZED_TYPES:
        tolerance = REQUANTIZED_TOLERANCE
    assert relative_error(got, reference_logits(weights, PROMPT_IDS, ROPE_MODES[arch])) < tolerance
    # The other rope pairing must fail clearly, or this case could not catch a wrong
    # (un)permutation of the Q/K rows.
    other = {"norm": "neox", "neox": "norm"}[ROPE_MODES[arch]]
    assert relative_error(got, reference_logits(weights, PROMPT_IDS, other)) > 0.25


def test_reference_is_sensitive_to_the_rope_layout(tmp_path: Path) -> None:
    """The wrong rope pairing on llama's permuted rows must not pass the check above."""
    src = write_tiny_gguf(tmp_path / "m.gguf", "llama", Q.F32)
    dest = convert_gguf(src, tmp_path / "model", dtype="float32")
    wrong = reference_logits(gguf_weights(src), PROMPT_IDS, "neox")
    assert relative_error(mlx_logits(dest), wrong) > 100 * TOLERANCES["float32"]


@pytest.mark.parametrize(
    ("arch", "qtype", "dtype", "stored"),
    [("llama", Q.Q4_K, "float16", mx.float16), ("qwen2", Q.Q8_0, "bfloat16", mx.bfloat16)],
)
def test_half_precision_outputs(
    tmp_path: Path, arch: str, qtype: Q, dtype: str, stored: mx.Dtype
) -> None:
    src = write_tiny_gguf(tmp_path / "m.gguf", arch, qtype)
    dest = convert_gguf(src, tmp_path / "model", dtype=dtype)
    assert {a.dtype for a in mx.load(str(dest / "model.safetensors")).values()} == {stored}
    want = reference_logits(gguf_weights(src), PROMPT_IDS, ROPE_MODES[arch])
    assert relative_error(mlx_logits(dest), want) < TOLERANCES[dtype]


def test_mixed_bit_widths_get_per_module_quantization(tmp_path: Path) -> None:
    """SmolLM2's layout: a Q8_0 embedding among Q4_1 layers."""
    src = write_tiny_gguf(tmp_path / "m.gguf", "llama", Q.Q4_1, embed_type=Q.Q8_0)
    dest = convert_gguf(src, tmp_path / "model")
    config = json.loads((dest / "config.json").read_text())
    assert config["quantization"] == {
        "group_size": 32, "bits": 4, "model.embed_tokens": {"group_size": 32, "bits": 8}
    }
    want = reference_logits(gguf_weights(src), PROMPT_IDS, "norm")
    assert relative_error(mlx_logits(dest), want) < TOLERANCES["native"]


def test_large_models_are_sharded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import models.gguf

    monkeypatch.setattr(models.gguf, "MAX_SHARD_BYTES", 40_000)
    src = write_tiny_gguf(tmp_path / "m.gguf", "qwen2", Q.Q4_0)
    dest = convert_gguf(src, tmp_path / "model")
    shards = sorted(p.name for p in dest.glob("model-*.safetensors"))
    assert len(shards) >= 2 and not (dest / "model.safetensors").exists()
    index = json.loads((dest / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == shards
    want = reference_logits(gguf_weights(src), PROMPT_IDS, "neox")
    assert relative_error(mlx_logits(dest), want) < TOLERANCES["native"]


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0], ids=lambda t: t.name)
def test_native_repack_is_bit_identical_to_mx_load(tmp_path: Path, qtype: Q) -> None:
    src = write_tiny_gguf(tmp_path / "m.gguf", "llama", qtype)
    loaded = mx.load(str(src))
    for tensor in gguf.GGUFReader(src).tensors:
        if tensor.tensor_type != qtype:
            continue
        base = tensor.name.removesuffix(".weight")
        weight, scales, biases = repack_native(raw_rows(tensor), qtype)
        np.testing.assert_array_equal(weight, np.array(loaded[tensor.name]))
        np.testing.assert_array_equal(scales, np.array(loaded[f"{base}.scales"]))
        np.testing.assert_array_equal(biases, np.array(loaded[f"{base}.biases"]))


def test_llama3_rope_freqs_become_llama3_rope_scaling(tmp_path: Path) -> None:
    hidden, _ = dims_for(Q.F32)
    head_dim = hidden // NUM_HEADS
    factor, low, high, original = 8.0, 1.0, 4.0, 8192
    wavelen = 2 * math.pi * ROPE_BASE ** (np.arange(0, head_dim, 2) / head_dim)
    smooth = np.clip((original / wavelen - low) / (high - low), 0, 1)
    freqs = 1 / ((1 - smooth) / factor + smooth)
    assert freqs.min() == 1.0 and freqs.max() == factor and len(set(freqs)) > 2
    src = write_tiny_gguf(tmp_path / "m.gguf", "llama", Q.F32, rope_freqs=freqs)
    dest = convert_gguf(src, tmp_path / "model", dtype="float32")
    config = json.loads((dest / "config.json").read_text())
    assert config["rope_scaling"]["rope_type"] == "llama3"
    assert config["rope_scaling"]["factor"] == factor
    want = reference_logits(gguf_weights(src), PROMPT_IDS, "norm")
    assert relative_error(mlx_logits(dest), want) < TOLERANCES["float32"]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_directory_loads_with_mlx_lm_load(tmp_path: Path, arch: str) -> None:
    from mlx_lm import load

    src = write_tiny_gguf(tmp_path / "m.gguf", arch, Q.Q8_0)
    dest = convert_gguf(src, tmp_path / "model")
    assert sorted(p.name for p in dest.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors",
        "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json",
    ]
    _, tokenizer = load(str(dest))
    text = "the cat sat on the mat, déjà vu 🐱\n\tdone  "
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.encode("<|im_start|>x<|im_end|>")[::2] == [1, 2]
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert set(tokenizer.eos_token_ids) == {2, 0}


def tiny_metadata(pre: str) -> dict:
    tokens, types, merges = tiny_vocab()
    return {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }


@pytest.mark.parametrize(
    ("pre", "pieces"),
    [
        ("smollm", ["Ġx", "1", "2", "3", "4", "5", "ĠĠĠĊĊ", "ĠI", "'ll"]),
        ("gpt-2", ["Ġx", "12345", "ĠĠĠĊĊ", "ĠI", "'ll"]),
        ("qwen2", ["Ġx", "1", "2", "3", "4", "5", "ĠĠĠĊĊ", "ĠI", "'ll"]),
        ("llama-bpe", ["Ġx", "123", "45", "ĠĠĠĊĊ", "ĠI", "'ll"]),
        ("default", ["Ġx", "123", "45", "ĠĠĠĊĊ", "ĠI", "'", "ll"]),
    ],
)
def test_pre_tokenizers_split_like_llama_cpp(pre: str, pieces: list[str]) -> None:
    """Digits alone (smollm, qwen2), in threes (llama3, default) or whole (gpt-2); a
    whitespace run keeps its last space for the next word; default isolates punctuation."""
    tokenizer = build_tokenizer(tiny_metadata(pre))
    text = " x12345   \n\n I'll"
    assert [p for p, _ in tokenizer.pre_tokenizer.pre_tokenize_str(text)] == pieces
    assert tokenizer.decode(tokenizer.encode(text).ids) == text


def test_add_bos_follows_metadata_and_llama3_default(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    src = write_tiny_gguf(tmp_path / "m.gguf", "llama", Q.F32, pre="llama-bpe", add_bos=None)
    tokenizer = AutoTokenizer.from_pretrained(convert_gguf(src, tmp_path / "model"))
    ids = tokenizer.encode("the cat")
    assert ids[0] == 1 and ids.count(1) == 1
    assert tokenizer.decode(ids, skip_special_tokens=True) == "the cat"


def test_cli_converts_and_reports_progress(tmp_path: Path) -> None:
    src = write_tiny_gguf(tmp_path / "m.gguf", "qwen2", Q.Q4_0)
    dest = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "models.gguf", str(src), str(dest), "--dtype", "float32"],
        capture_output=True, text=True, cwd=REPO, check=True,
    )
    assert result.stdout.strip().splitlines()[-1] == str(dest)
    total = len(gguf.GGUFReader(src).tensors)
    assert f"converting {total}/{total} tensors" in result.stderr
    assert (dest / "model.safetensors").is_file()


def test_cli_reports_errors_with_exit_code_2(tmp_path: Path) -> None:
    src = write_tiny_gguf(tmp_path / "m.gguf", "falcon", Q.F32)
    result = subprocess.run(
        [sys.executable, "-m", "models.gguf", str(src), str(tmp_path / "out")],
        capture_output=True, text=True, cwd=REPO,
    )
    assert result.returncode == 2 and "'falcon'" in result.stderr and not result.stdout


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"arch": "falcon", "qtype": Q.F32}, ["falcon"]),
        ({"arch": "llama", "qtype": Q.TQ1_0, "embed_type": Q.F32},
         ["TQ1_0", "blk.0.attn_q.weight"]),
        ({"arch": "qwen2", "qtype": Q.IQ4_NL}, ["IQ4_NL", "token_embd.weight"]),
        ({"arch": "llama", "qtype": Q.F32, "extra_tensor": "blk.0.ffn_gate_exps.weight"},
         ["blk.0.ffn_gate_exps.weight"]),
        ({"arch": "llama", "qtype": Q.F32, "tokenizer_model": "llama"},
         ["'llama'", "SentencePiece"]),
        ({"arch": "llama", "qtype": Q.F32, "pre": "no-such-pre"}, ["no-such-pre"]),
    ],
    ids=["architecture", "tensor-type", "tensor-type-embedding", "tensor-name",
         "sentencepiece", "pre-tokenizer"],
)
def test_unsupported_inputs_raise_value_error_naming_them(
    tmp_path: Path, kwargs: dict, named: list[str]
) -> None:
    src = write_tiny_gguf(tmp_path / "m.gguf", **kwargs)
    with pytest.raises(ValueError) as raised:
        convert_gguf(src, tmp_path / "model")
    for word in named:
        assert word in str(raised.value)
    assert not (tmp_path / "model").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["m.gguf"]
