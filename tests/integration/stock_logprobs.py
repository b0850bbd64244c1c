"""A model's log-probabilities computed by stock MLX and plain mlx-lm, for comparing a served
model's with. Run as a script (`python tests/integration/stock_logprobs.py MODEL_DIR`; one
JSON request per line on stdin, one JSON answer per line on stdout): nothing of mlxd is importable or imported,
so none of its kernels, loaders or fused projections run. Every quantized layer is
dequantized to float32 (scales and biases first: the exact values of the file's weights),
and the whole sequence goes through the model in one causal forward pass, with no cache.

Request: {"cases": [{"prompt": [ids], "continuation": [hex of each token's bytes]}],
"top": k, "perturb": x}. Each continuation token is looked up by its bytes (a special
token by its name); the answer gives, at each continuation step, that token's log-
probability and the k most likely tokens (hex bytes, log-probability). With "perturb",
the final norm's weight is multiplied by 1 + x first: a slightly wrong model, for a
negative control.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.utils import load


def dequantize_to_float32(model: nn.Module) -> int:
    """Every QuantizedLinear/QuantizedEmbedding replaced by its float32 equivalent."""
    replacements = []
    for name, module in model.named_modules():
        if not isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            continue
        biases = module.get("biases")
        weight = mx.dequantize(module.weight, module.scales.astype(mx.float32),
                               None if biases is None else biases.astype(mx.float32),
                               group_size=module.group_size, bits=module.bits, mode=module.mode)
        if isinstance(module, nn.QuantizedLinear):
            layer = nn.Linear(weight.shape[1], weight.shape[0], bias="bias" in module)
            if "bias" in module:
                layer.bias = module.bias
        else:
            layer = nn.Embedding(weight.shape[0], weight.shape[1])
        layer.weight = weight
        replacements.append((name, layer))
    model.update_modules(tree_unflatten(replacements))
    model.set_dtype(mx.float32)
    return len(replacements)


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the character each byte is spelled with."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


def token_bytes(tokenizer: Any) -> dict[int, bytes]:
    """Each token id's bytes; an added (special) token's are its name."""
    backend = tokenizer._tokenizer
    added = {token_id: token.content for token_id, token in backend.added_tokens_decoder.items()}
    decoder = _byte_decoder()
    table = {}
    for token, token_id in backend.get_vocab().items():
        if token_id in added:
            table[token_id] = added[token_id].encode()
        else:
            table[token_id] = bytes(decoder[c] for c in token)
    return table


def answer(model: nn.Module, table: dict[int, bytes], request: dict[str, Any]) -> list[list[dict[str, Any]]]:
    ids_of: dict[bytes, int] = {}
    for token_id, raw in sorted(table.items(), reverse=True):  # the lowest id of equal bytes wins
        ids_of[raw] = token_id
    cases = []
    for case in request["cases"]:
        prompt = case["prompt"]
        continuation = [ids_of[bytes.fromhex(raw)] for raw in case["continuation"]]
        logits = model(mx.array([prompt + continuation[:-1]]))[0, len(prompt) - 1:].astype(mx.float32)
        logprobs = np.array(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
        steps = []
        for token, values in zip(continuation, logprobs):
            best = np.argsort(-values, kind="stable")[: request["top"]]
            steps.append({"token": token, "logprob": float(values[token]),
                          "top": [[table.get(int(t), b"").hex(), float(values[t])] for t in best]})
        cases.append(steps)
    return cases


def _assert_stock() -> None:
    loaded = sorted(name for name in sys.modules if name.split(".")[0] in ("worker", "router", "protocol", "tests"))
    assert not loaded, f"mlxd's modules in the reference process: {loaded}"
    for op in (mx.logsumexp, mx.quantized_matmul, mx.fast.rms_norm, mx.fast.rope,
               mx.fast.scaled_dot_product_attention):
        assert type(op).__name__ == "nb_func", op  # MLX's own, not a replacement


def main() -> None:
    """Load once, then answer one JSON request per stdin line with one JSON line."""
    model, tokenizer = load(sys.argv[1])
    num = dequantize_to_float32(model)
    mx.eval(model.parameters())
    table = token_bytes(tokenizer)
    dtypes = sorted({str(v.dtype) for _, v in tree_flatten(model.parameters())})
    norm = dict(tree_flatten(model.parameters()))["model.norm.weight"]
    for line in sys.stdin:
        request = json.loads(line)
        model.update(tree_unflatten([("model.norm.weight", norm * (1 + (request.get("perturb") or 0.0)))]))
        cases = answer(model, table, request)
        _assert_stock()
        print(json.dumps({"cases": cases, "dequantized_layers": num, "dtypes": dtypes}), flush=True)


if __name__ == "__main__":
    main()
