"""Where one decode step and one prefill chunk spend their time, op by op, in the worker's
own model setup (same loader, BLAS, kernels and weights as the service).

MLX is lazy: a step is one graph evaluated at the end. To see each op, the profiler
evaluates the inputs of every leaf call (projections, norms, rope, attention, the gated
activation, the embedding), times the call with its output evaluated, and charges the
rest of the step (residual adds, reshapes, cache updates, Python) to "other". The
profiled step is slower than a real one (no graph batching), so the unprofiled step time
is measured in the same run and printed next to it. Prints JSON (stdout) and a table
(stderr).

    python bench/step_profile.py [--model DIR] [--dtype auto|float32] [--batch 1 8]
        [--chunk 512] [--prefill-context 0 8000 20000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from worker.blas import bind_fast_blas  # noqa: E402  (binds BLAS before MLX loads)

BLAS = bind_fast_blas()

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

from worker.fused_projections import ProjectionPart  # noqa: E402
from worker.model_loader import load_for_serving  # noqa: E402


class Timings:
    """Seconds and calls per op name, for one profiled region."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] += seconds
        self.calls[name] += 1


def _arrays(value: Any) -> list[mx.array]:
    if isinstance(value, mx.array):
        return [value]
    if isinstance(value, (list, tuple)):
        return [a for item in value for a in _arrays(item)]
    return []


def _timed(name: str, call: Callable[..., Any], timings: list[Timings]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not timings:
            return call(*args, **kwargs)
        mx.eval(*_arrays(list(args) + list(kwargs.values())))
        start = time.perf_counter()
        out = call(*args, **kwargs)
        mx.eval(*_arrays(out))
        timings[-1].add(name, time.perf_counter() - start)
        return out

    return wrapper


def _layer_name(path: str, module: nn.Module) -> str:
    leaf = path.rsplit(".", 1)[-1]
    if isinstance(module, ProjectionPart):  # the first of a fused group does the group's matmul
        return f"matmul {leaf} (quantized, fused with its siblings)"
    kind = "quantized" if isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)) else "fp32"
    if isinstance(module, (nn.Linear, nn.QuantizedLinear)):
        return f"matmul {leaf} ({kind})"
    if isinstance(module, (nn.Embedding, nn.QuantizedEmbedding)):
        return f"embedding ({kind})"
    return type(module).__name__


@contextmanager
def instrumented(model: nn.Module) -> Iterator[list[Timings]]:
    """Wrap every leaf module instance and the attention/activation functions; yield the
    stack whose top Timings collects (empty stack: wrappers pass through)."""
    timings: list[Timings] = []
    leaves = (nn.Linear, nn.QuantizedLinear, nn.Embedding, nn.QuantizedEmbedding, nn.RMSNorm, nn.RoPE, nn.LayerNorm,
              ProjectionPart)
    patched: list[tuple[nn.Module, Any]] = []
    for path, module in model.named_modules():
        if isinstance(module, leaves) and path:
            name = _layer_name(path, module)
            original = type(module).__call__
            # an instance attribute does not change what `module(x)` calls: wrap through a subclass
            subclass = type(f"Profiled{type(module).__name__}", (type(module),),
                            {"__call__": _timed(name, original, timings)})
            patched.append((module, type(module)))
            module.__class__ = subclass
    tied_lm_head: list[tuple[nn.Module, Any]] = []
    embed = getattr(getattr(model, "model", model), "embed_tokens", None)
    if embed is not None and hasattr(embed, "as_linear"):
        tied_lm_head.append((embed, embed.as_linear))
        kind = "quantized" if isinstance(embed, nn.QuantizedEmbedding) else "fp32"
        embed.as_linear = _timed(f"matmul lm_head, tied ({kind})", embed.as_linear, timings)
    functions: list[tuple[Any, str, Any]] = []
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("mlx_lm.models.") or module is None:
            continue
        for attr, label in (("scaled_dot_product_attention", "attention"), ("swiglu", "swiglu")):
            fn = getattr(module, attr, None)
            if fn is not None:
                functions.append((module, attr, fn))
                setattr(module, attr, _timed(label, fn, timings))
    try:
        yield timings
    finally:
        for module, cls in patched:
            module.__class__ = cls
        for embed, original in tied_lm_head:
            embed.as_linear = original
        for module, attr, fn in functions:
            setattr(module, attr, fn)


def _prompt(length: int, salt: int) -> mx.array:
    return (mx.arange(length) * 7919 + salt * 104729) % 20000 + 100


def _decode_step(model: nn.Module, caches: list[Any], tokens: mx.array) -> mx.array:
    logits = model(tokens, cache=caches)
    mx.eval(logits)
    return logits


def profile_decode(model: nn.Module, batch: int, context: int, steps: int) -> dict[str, Any]:
    """One batch of `batch` sequences at `context` tokens: real step time, then a
    profiled step broken down by op."""
    caches = make_prompt_cache(model)
    prompt = mx.stack([_prompt(context, salt) for salt in range(batch)])
    model(prompt, cache=caches)
    mx.eval([c.state for c in caches])
    token = prompt[:, -1:]
    for _ in range(3):
        _decode_step(model, caches, token)
    start = time.perf_counter()
    for _ in range(steps):
        _decode_step(model, caches, token)
    real = (time.perf_counter() - start) / steps
    with instrumented(model) as stack:
        stack.append(Timings())
        profiled_start = time.perf_counter()
        for _ in range(steps):
            _decode_step(model, caches, token)
        profiled = (time.perf_counter() - profiled_start) / steps
        timings = stack.pop()
    return _report(timings, steps, real, profiled, tokens=batch)


def profile_prefill(model: nn.Module, chunk: int, context: int) -> dict[str, Any]:
    """One prefill chunk of `chunk` tokens after `context` cached ones."""
    def fresh() -> list[Any]:
        caches = make_prompt_cache(model)
        prompt = _prompt(context, 99)[None]
        for start in range(0, context, 1024):  # in pieces, as the service prefills a long prompt
            model(prompt[:, start : start + 1024], cache=caches)
            mx.eval([c.state for c in caches])
        return caches

    tokens = _prompt(chunk, 7)[None]
    _decode_step(model, fresh(), tokens)  # warm-up
    caches = fresh()
    start = time.perf_counter()
    _decode_step(model, caches, tokens)
    real = time.perf_counter() - start
    caches = fresh()
    with instrumented(model) as stack:
        stack.append(Timings())
        profiled_start = time.perf_counter()
        _decode_step(model, caches, tokens)
        profiled = time.perf_counter() - profiled_start
        timings = stack.pop()
    return _report(timings, 1, real, profiled, tokens=chunk)


def _report(timings: Timings, repeats: int, real: float, profiled: float, tokens: int) -> dict[str, Any]:
    ops = {name: {"ms": round(seconds / repeats * 1e3, 3), "calls": timings.calls[name] // repeats}
           for name, seconds in sorted(timings.seconds.items(), key=lambda kv: -kv[1])}
    accounted = sum(seconds for seconds in timings.seconds.values()) / repeats
    ops["other (adds, reshapes, cache updates, Python)"] = {"ms": round((profiled - accounted) * 1e3, 3), "calls": 0}
    return {
        "step_ms": round(real * 1e3, 3),
        "tokens_per_s": round(tokens / real, 1),
        "profiled_step_ms": round(profiled * 1e3, 3),
        "ops": ops,
    }


def _print_table(title: str, result: dict[str, Any]) -> None:
    sys.stderr.write(f"\n{title}: {result['step_ms']:.1f} ms per step ({result['tokens_per_s']} tok/s); "
                     f"profiled {result['profiled_step_ms']:.1f} ms\n")
    total = result["profiled_step_ms"] or 1.0
    for name, op in result["ops"].items():
        sys.stderr.write(f"  {op['ms']:8.2f} ms {100 * op['ms'] / total:5.1f}%  x{op['calls']:<4} {name}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=REPO / ".cache" / "test-home" / "models" / "SmolLM2-135M-Instruct")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32"])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="decode batch sizes to profile")
    parser.add_argument("--context", type=int, default=300, help="tokens already in the cache when decoding")
    parser.add_argument("--steps", type=int, default=20, help="decode steps timed per measurement")
    parser.add_argument("--chunk", type=int, default=512, help="prefill chunk to profile (0: skip)")
    parser.add_argument("--prefill-context", type=int, nargs="+", default=[0],
                        help="tokens already in the cache before the prefill chunk (several: one profile "
                             "each; a warm agent turn prefills ~1K new tokens after the whole session)")
    args = parser.parse_args(argv)
    loaded = load_for_serving(args.model, args.dtype)
    result: dict[str, Any] = {
        "model": str(args.model),
        "setup": {"dtype": loaded.dtype, "quantization": loaded.quantization, "kernels": loaded.attention,
                  "blas": BLAS, "weights_mb": round(loaded.weights_bytes / 1e6, 1)},
        "decode": {},
    }
    for batch in args.batch:
        decode = profile_decode(loaded.model, batch, args.context, args.steps)
        result["decode"][f"batch_{batch}"] = decode
        _print_table(f"decode, batch {batch}, context {args.context}", decode)
    for context in args.prefill_context if args.chunk else []:
        prefill = profile_prefill(loaded.model, args.chunk, context=context)
        result["prefill" if context == 0 else f"prefill_after_{context}"] = prefill
        _print_table(f"prefill chunk of {args.chunk} tokens after {context} cached", prefill)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
