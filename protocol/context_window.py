"""A chat model's context window as its config.json declares it: the worker serves that
window (capped by `max_context_tokens`), and the router reports it for a model it has not
loaded yet (`/v1/models`, which `mlxd launch` gives the agents), so the two never disagree."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FALLBACK_CONTEXT = 4096  # a config.json that names no window: what most small models had


def declared_context_length(config: Mapping[str, Any]) -> int:
    """The window a model's config.json declares, under the names architectures use."""
    return int(config.get("max_position_embeddings") or config.get("max_seq_len") or config.get("n_positions")
               or FALLBACK_CONTEXT)


def served_context_length(declared: int, max_context_tokens: int) -> int:
    """The window a worker serves: the declared one, capped by `max_context_tokens` (0: no cap)."""
    return min(declared, max_context_tokens) if max_context_tokens > 0 else declared
