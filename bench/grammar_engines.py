"""Grammar engines for constrained decoding, on our shapes: llguidance vs outlines-core.

The worker masks every constrained token with a grammar engine, so what matters is
(a) the vocabulary index built once per worker, (b) the compile per request and (c) the
mask per token, on SmolLM2's 49,152-token vocabulary and a JSON schema of the kind the
OpenAI SDK's `parse()` sends (nested objects, arrays, enums, $defs/$ref, anyOf with null).
Each engine walks the same valid document token by token (mask, check the token is
allowed, advance); both run in this process, one after the other, on the same tokens.
xgrammar is not measured: its wheel pulls in torch and CUDA. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from common import emit, environment, log, percentile, prepare_fp32_model

from protocol.constraints import JSON_OPTIONS

# A purchase order as a Pydantic model's schema: what `client.chat.completions.parse` sends.
SCHEMA: dict[str, Any] = {
    "$defs": {
        "Tier": {"enum": ["free", "pro", "enterprise"], "title": "Tier", "type": "string"},
        "Customer": {
            "properties": {"name": {"title": "Name", "type": "string"},
                           "email": {"title": "Email", "type": "string"},
                           "tier": {"$ref": "#/$defs/Tier"}},
            "required": ["name", "email", "tier"], "title": "Customer", "type": "object",
            "additionalProperties": False,
        },
        "Item": {
            "properties": {"sku": {"title": "Sku", "type": "string"},
                           "quantity": {"title": "Quantity", "type": "integer"},
                           "price": {"title": "Price", "type": "number"},
                           "tags": {"items": {"type": "string"}, "title": "Tags", "type": "array"}},
            "required": ["sku", "quantity", "price", "tags"], "title": "Item", "type": "object",
            "additionalProperties": False,
        },
    },
    "properties": {
        "order_id": {"title": "Order Id", "type": "string"},
        "customer": {"$ref": "#/$defs/Customer"},
        "items": {"items": {"$ref": "#/$defs/Item"}, "title": "Items", "type": "array"},
        "status": {"enum": ["pending", "shipped", "delivered", "cancelled"], "title": "Status", "type": "string"},
        "notes": {"anyOf": [{"type": "string"}, {"type": "null"}], "title": "Notes"},
    },
    "required": ["order_id", "customer", "items", "status", "notes"],
    "title": "Order", "type": "object", "additionalProperties": False,
}
DOCUMENT: dict[str, Any] = {
    "order_id": "A-2024-0001",
    "customer": {"name": "Ada Lovelace", "email": "ada@example.com", "tier": "pro"},
    "items": [
        {"sku": "KB-101", "quantity": 2, "price": 49.5, "tags": ["keyboard", "wireless"]},
        {"sku": "MS-220", "quantity": 1, "price": 19.99, "tags": ["mouse"]},
        {"sku": "HD-900", "quantity": 3, "price": 129.0, "tags": ["headset", "usb", "noise cancelling"]},
    ],
    "status": "shipped",
    "notes": None,
}


def document_tokens(tokenizer_json: Path) -> list[int]:
    """The document as the model would write it under our JSON options (", " and ": ")."""
    from tokenizers import Tokenizer

    text = json.dumps(DOCUMENT, separators=(JSON_OPTIONS["item_separator"], JSON_OPTIONS["key_separator"]))
    return Tokenizer.from_file(str(tokenizer_json)).encode(text, add_special_tokens=False).ids


def timed(function: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    result = function()
    return result, time.perf_counter() - started


def walk(tokens: list[int], mask: Callable[[], np.ndarray], advance: Callable[[int], None]) -> dict[str, Any]:
    """Mask then advance for every token; each token must be allowed by its mask."""
    mask_s, advance_s = [], []
    for token in tokens:
        bits, seconds = timed(mask)
        mask_s.append(seconds)
        if not (int(bits[token // 32]) >> (token % 32)) & 1:
            raise RuntimeError(f"token {token} was masked out: the engine rejects a valid document")
        _, seconds = timed(lambda token=token: advance(token))
        advance_s.append(seconds)
    return {
        "num_tokens": len(tokens),
        "mask_us_mean": round(1e6 * statistics.fmean(mask_s), 1),
        "mask_us_p50": round(1e6 * (percentile(mask_s, 50) or 0.0), 1),
        "mask_us_p99": round(1e6 * (percentile(mask_s, 99) or 0.0), 1),
        "advance_us_mean": round(1e6 * statistics.fmean(advance_s), 1),
        "per_token_us_mean": round(1e6 * (statistics.fmean(mask_s) + statistics.fmean(advance_s)), 1),
    }


def measure_llguidance(model_dir: Path, vocab_size: int, eos: list[int], tokens: list[int],
                       repeats: int) -> dict[str, Any]:
    """llguidance as the worker uses it (protocol.constraints, worker.vocabulary)."""
    import llguidance
    from mlx_lm.utils import load_tokenizer

    from protocol.constraints import grammar_for
    from protocol.messages import Constraint
    from worker.vocabulary import TokenVocabulary

    vocabulary = TokenVocabulary(load_tokenizer(model_dir), vocab_size, eos)
    tokenizer, index_s = timed(lambda: vocabulary.llg)
    grammar = grammar_for(Constraint("json_schema", json.dumps(SCHEMA)))
    compile_s, walks = [], []
    for _ in range(repeats):
        matcher, seconds = timed(lambda: llguidance.LLMatcher(tokenizer, grammar, log_level=0))
        compile_s.append(seconds)
        if matcher.is_error():
            raise RuntimeError(matcher.get_error())
        bitmask = np.zeros((vocab_size + 31) // 32, dtype=np.int32)

        def mask(matcher: Any = matcher, bitmask: np.ndarray = bitmask) -> np.ndarray:
            matcher.unsafe_compute_mask_ptr(bitmask.ctypes.data, bitmask.nbytes)
            return bitmask

        def advance(token: int, matcher: Any = matcher) -> None:
            if not matcher.consume_token(token):
                raise RuntimeError(matcher.get_error())

        walks.append(walk(tokens, mask, advance))
    return {"version": _version("llguidance"), "vocabulary_index_s": round(index_s, 3),
            "compile_ms": round(1e3 * statistics.median(compile_s), 2), **_median_walk(walks)}


def measure_outlines_core(model_dir: Path, vocab_size: int, eos: list[int], tokens: list[int],
                          repeats: int) -> dict[str, Any]:
    """outlines-core: the schema becomes a regex, compiled into a token-level index."""
    import outlines_core
    from mlx_lm.utils import load_tokenizer

    from worker.vocabulary import TokenVocabulary

    # token bytes from the worker's vocabulary: both engines see the very same tokens
    decoder = TokenVocabulary(load_tokenizer(model_dir), vocab_size, eos)
    decoder.llg  # noqa: B018  (built outside the timing)

    def build_vocabulary() -> Any:
        pieces: dict[bytes, list[int]] = {}
        for token in range(vocab_size):
            if token in eos or decoder.llg.is_special_token(token):
                continue
            piece = decoder.token_bytes(token)
            if piece:
                pieces.setdefault(piece, []).append(token)
        return outlines_core.Vocabulary(eos[0], pieces)

    vocabulary, index_s = timed(build_vocabulary)
    separators = "[ ]?"  # its own whitespace rule: optional single spaces, as ours emits
    compile_s, walks = [], []
    for _ in range(repeats):
        def compile_index() -> Any:
            regex = outlines_core.json_schema.build_regex_from_schema(json.dumps(SCHEMA), separators)
            return outlines_core.Index(regex, vocabulary)

        index, seconds = timed(compile_index)
        compile_s.append(seconds)
        guide = outlines_core.Guide(index)
        bitmask = np.zeros((vocab_size + 31) // 32, dtype=np.int32)

        def mask(guide: Any = guide, bitmask: np.ndarray = bitmask) -> np.ndarray:
            guide.write_mask_into(bitmask.ctypes.data, bitmask.size, 4)
            return bitmask

        def advance(token: int, guide: Any = guide) -> None:
            guide.advance(token, return_tokens=False)

        walks.append(walk(tokens, mask, advance))
    return {"version": _version("outlines-core"), "vocabulary_index_s": round(index_s, 3),
            "compile_ms": round(1e3 * statistics.median(compile_s), 2), **_median_walk(walks)}


def _median_walk(walks: list[dict[str, Any]]) -> dict[str, Any]:
    return {key: (statistics.median(w[key] for w in walks) if key != "num_tokens" else walks[0][key])
            for key in walks[0]}


def _version(name: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="compiles and walks per engine (median; default 5)")
    parser.add_argument("--out", type=Path, help="also write the JSON to this file")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    env = environment()
    model_dir = prepare_fp32_model()
    config = json.loads((model_dir / "config.json").read_text())
    vocab_size = int(config["vocab_size"])
    eos = [int(config["eos_token_id"])] if isinstance(config.get("eos_token_id"), int) else list(config["eos_token_id"])
    tokens = document_tokens(model_dir / "tokenizer.json")
    log("vocabulary %d tokens, EOS %s, document %d tokens", vocab_size, eos, len(tokens))
    results: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for name, measure in (("llguidance", measure_llguidance), ("outlines_core", measure_outlines_core)):
        try:
            results[name] = measure(model_dir, vocab_size, eos, tokens, args.repeats)
            log("%s: %s", name, results[name])
        except Exception as exc:  # report what the other one measured
            log("%s failed: %s", name, exc)
            errors[name] = f"{type(exc).__name__}: {exc}"
    mean = "per_token_us_mean"
    ratio = (round(results["outlines_core"][mean] / results["llguidance"][mean], 2)
             if mean in results.get("outlines_core", {}) and mean in results.get("llguidance", {}) else None)
    report = {
        "benchmark": "grammar_engines",
        "per_token_ratio_outlines_vs_llguidance": ratio,
        "config": {"model_dir": str(model_dir), "vocab_size": vocab_size, "schema": SCHEMA["title"],
                   "document_tokens": len(tokens), "repeats": args.repeats, "json_options": JSON_OPTIONS},
        "environment": env,
        "results": results,
        "errors": errors,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    emit(report, args.out)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
