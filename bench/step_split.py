"""How a worker's steps split their time during one run, from its pong counters on
/metrics (`mlxd_engine_*`, `mlxd_grammar_*`): read before and after the run, a heartbeat
apart from its edges so each read holds a fresh pong."""

from __future__ import annotations

import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

COUNTERS = ("mlxd_engine_steps", "mlxd_engine_step_rows", "mlxd_engine_step_seconds",
            "mlxd_engine_step_generate_seconds", "mlxd_grammar_wait_seconds", "mlxd_grammar_mask_seconds")
HEARTBEAT_WAIT_S = 2.5  # the service pings its workers every 2 s (heartbeat_s)


def engine_counters(base_url: str, model: str, settle_s: float = HEARTBEAT_WAIT_S) -> dict[str, float]:
    """The model's worker counters once a pong taken after now has arrived."""
    time.sleep(settle_s)
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name in COUNTERS and sample.labels.get("model") == model:
                found[name] = sample.value
    return found


def step_split(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict[str, Any]:
    """Per step, in ms: the whole step, inside the generator, the grammar's wait for the
    step before and its masks, and the rest; the wall time per step (the steps plus the
    worker's loop between them: receiving requests, answering pings)."""
    delta = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in COUNTERS}
    steps = delta["mlxd_engine_steps"]
    if steps <= 0:
        return {"steps": 0}

    def per_step_ms(name: str) -> float:
        return round(1000 * delta[name] / steps, 2)

    step = per_step_ms("mlxd_engine_step_seconds")
    generate = per_step_ms("mlxd_engine_step_generate_seconds")
    wait = per_step_ms("mlxd_grammar_wait_seconds")
    mask = per_step_ms("mlxd_grammar_mask_seconds")
    return {
        "steps": int(steps), "mean_batch": round(delta["mlxd_engine_step_rows"] / steps, 2),
        "wall_ms_per_step": round(1000 * wall_s / steps, 2), "step_ms": step,
        "generator_ms": generate, "grammar_wait_ms": wait, "grammar_mask_ms": mask,
        "generator_rest_ms": round(generate - wait - mask, 2), "after_generator_ms": round(step - generate, 2),
    }
