"""q/k/v and gate/up fused into one quantized matmul each: the same bits as the separate
projections, on the real models (SmolLM2: no biases; Qwen2.5: q/k/v biases), with the
parameters counted once; a part called with another input still gets its own slice."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

mx = pytest.importorskip("mlx.core")

if mx.default_device().type != mx.DeviceType.cpu or sys.platform == "darwin":
    pytest.skip("fusion runs on the CPU kernels' panels", allow_module_level=True)
pytest.importorskip("worker._cpu_kernels", reason="kernels not built: run `make kernels`")

_CHECK = """
import sys
import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache
from worker.model_loader import load_for_serving
from worker.fused_projections import ProjectionPart, fuse_sibling_projections

loaded = load_for_serving(sys.argv[1], fuse_projections=False)
model = loaded.model
layer = next(l for l in model.model.layers if len({l.self_attn.q_proj.bits, l.self_attn.k_proj.bits,
                                                     l.self_attn.v_proj.bits}) == 1)
assert not isinstance(layer.self_attn.q_proj, ProjectionPart)  # the loader left them apart
before_bytes = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
prompt = mx.array([list(range(100, 160))])
x = mx.random.normal((2, 3, layer.self_attn.q_proj.scales.shape[1] * layer.self_attn.q_proj.group_size))
separate = [layer.self_attn.k_proj(x), layer.mlp.up_proj(x)]


def run():
    cache = make_prompt_cache(model)
    logits = [model(prompt, cache=cache)]
    for token in (7, 8, 9):  # decode steps on the cache
        logits.append(model(mx.array([[token]]), cache=cache))
    mx.eval(logits)
    return logits


want = run()
fused = fuse_sibling_projections(model)
# every MLP; attention where q, k and v share a width (Qwen's Q4_K_M keeps some v_proj at 8 bits)
assert len(model.model.layers) < fused <= 2 * len(model.model.layers), fused
assert all(isinstance(l.mlp.up_proj, ProjectionPart) for l in model.model.layers)
assert isinstance(layer.self_attn.k_proj, ProjectionPart)
assert sum(v.nbytes for _, v in tree_flatten(model.parameters())) == before_bytes  # owned once
got = run()
assert all(mx.array_equal(a, b).item() for a, b in zip(want, got)), "fused logits differ"
# once every sibling took its slice, nothing holds the input or the outputs (a prefill
# chunk's would be tens of MB a layer)
assert all(p._fused._last is None for _, p in model.named_modules() if isinstance(p, ProjectionPart))
# k_proj and up_proj alone (their siblings never saw x): their slices, the same bits
assert mx.array_equal(layer.self_attn.k_proj(x), separate[0]).item()
assert mx.array_equal(layer.mlp.up_proj(x), separate[1]).item()
print("ok", fused)
"""


@pytest.mark.parametrize("model", ["default", "qwen"])
def test_fused_projections_give_the_same_logits(model: str, request: pytest.FixtureRequest) -> None:
    model_dir: Path = request.getfixturevalue("default_model_dir" if model == "default" else "qwen_model_dir")
    result = subprocess.run([sys.executable, "-c", _CHECK, str(model_dir)], capture_output=True, text=True,
                            timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("ok "), result.stdout
