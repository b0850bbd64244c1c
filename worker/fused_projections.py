"""Sibling projections of one input (attention's q/k/v, the MLP's gate/up) served as one
quantized matmul on the CPU kernels, so a decode step runs 4 matmuls per layer, not 7.

mlx-lm's models call `q_proj(x)`, `k_proj(x)`, `v_proj(x)` (and `gate_proj(x)`,
`up_proj(x)`) on the same array. After fusing, each of those modules is a
`ProjectionPart` of one `FusedProjections`: the first call with an input multiplies it by
the concatenated weights once, and the other parts of the same input take their slice.
Every output column is computed exactly as before (the kernels compute each weight row
on its own), so results are the same bits. A part called with another input computes
the fused product for that input: slower, never wrong.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

# (container attribute names) whose members mlx-lm's models call on one shared input
SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class FusedProjections:
    """The concatenated weights of sibling quantized projections, and the last input's
    outputs (so the siblings that follow reuse them). Not a module: the first part owns
    the arrays as parameters, so the model's parameters count them once."""

    def __init__(self, parts: list[nn.QuantizedLinear]) -> None:
        first = parts[0]
        self.group_size, self.bits, self.mode = first.group_size, first.bits, getattr(first, "mode", "affine")
        self.weight = mx.concatenate([p.weight for p in parts])
        self.scales = mx.concatenate([p.scales for p in parts])
        self.biases = mx.concatenate([p.biases for p in parts])
        sizes = [p.scales.shape[0] for p in parts]
        self.offsets = [sum(sizes[:i]) for i in range(1, len(sizes))]
        biased = [p for p in parts if "bias" in p]
        self.bias = None
        if biased:  # a part without a bias adds zeros (x + 0 is x)
            dtype = biased[0].bias.dtype
            self.bias = mx.concatenate([p.bias if "bias" in p else mx.zeros((n,), dtype=dtype)
                                        for p, n in zip(parts, sizes, strict=True)])
        # the last input, its parts' outputs, and which parts have not taken theirs: held
        # only until every sibling has (a prefill chunk's MLP outputs are tens of MB a layer)
        self._last: tuple[mx.array, list[mx.array]] | None = None
        self._waiting: set[int] = set()

    def output(self, x: mx.array, index: int) -> mx.array:
        if self._last is not None and self._last[0] is x and index in self._waiting:
            parts = self._last[1]
        else:
            y = mx.quantized_matmul(x, self.weight, scales=self.scales, biases=self.biases, transpose=True,
                                    group_size=self.group_size, bits=self.bits, mode=self.mode)
            if self.bias is not None:
                y = y + self.bias
            parts = mx.split(y, self.offsets, axis=-1)
            self._last, self._waiting = (x, parts), set(range(len(parts)))
        self._waiting.discard(index)
        if not self._waiting:
            self._last = None
        return parts[index]


class ProjectionPart(nn.Module):
    """One sibling's place in the model: its slice of the fused product."""

    def __init__(self, fused: FusedProjections, index: int) -> None:
        super().__init__()
        self._fused = fused
        self._index = index
        if index == 0:
            self.weight, self.scales, self.biases = fused.weight, fused.scales, fused.biases
            if fused.bias is not None:
                self.bias = fused.bias

    def __call__(self, x: mx.array) -> mx.array:
        return self._fused.output(x, self._index)


def _fusable(parts: list[nn.Module]) -> bool:
    if not all(isinstance(p, nn.QuantizedLinear) and p.get("biases") is not None for p in parts):
        return False
    first = parts[0]
    return all(p.bits == first.bits and p.group_size == first.group_size
               and getattr(p, "mode", "affine") == getattr(first, "mode", "affine")
               and p.scales.dtype == first.scales.dtype and p.biases.dtype == first.biases.dtype
               and p.weight.shape[1] == first.weight.shape[1] and p.scales.shape[1] == first.scales.shape[1]
               and p.weight.shape[0] * first.scales.shape[0] == first.weight.shape[0] * p.scales.shape[0]
               for p in parts) and len({p.bias.dtype for p in parts if "bias" in p}) <= 1


def fuse_sibling_projections(model: nn.Module) -> int:
    """Fuse every q/k/v and gate/up group of quantized projections in `model` (call it
    only once the kernels serve them: the weights are then in panels, which stack);
    returns how many groups were fused."""
    fused = 0
    for _, module in model.named_modules():
        for names in SIBLINGS:
            parts = [module.get(name) if isinstance(module, dict) else None for name in names]
            if any(p is None for p in parts) or not _fusable(parts):
                continue
            shared = FusedProjections(parts)
            mx.eval(shared.weight, shared.scales, shared.biases, *([shared.bias] if shared.bias is not None else []))
            for index, name in enumerate(names):
                setattr(module, name, ProjectionPart(shared, index))
            fused += 1
    return fused
