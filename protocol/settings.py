"""The settings the router hands its children, defined once.

Each is a field of a frozen dataclass with its default and its one line of why (the
`help` metadata): the router embeds these dataclasses in its own config (where each field
is also a flag and a config-file key of the same name), and sends them whole in the
handshake, so a worker or kvstore runs with exactly what the router was given and has no
defaults of its own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

DTYPES = ("auto", "float32", "float16", "bfloat16")
COMPRESSIONS = ("lz4", "none")
# how a chat prompt is laid out (worker/prompt_layout.py): what is stable across sessions
# first (tool definitions before the system text), or exactly as the chat template renders
STABLE_FIRST = "stable_first"
TEMPLATE_LAYOUT = "template"
PROMPT_LAYOUTS = (STABLE_FIRST, TEMPLATE_LAYOUT)
PROMPT_LOOKUP = "prompt_lookup"
DRAFT_MODEL = "draft_model"
SPECULATIONS = ("off", PROMPT_LOOKUP, DRAFT_MODEL)


def layout_in_effect(requested: str, tools_first: bool) -> str:
    """The layout a request with tools and a system text gets: `requested`, where the model's
    template lets tools go first (`Ready.tools_first`), else the template's own."""
    return STABLE_FIRST if requested == STABLE_FIRST and tools_first else TEMPLATE_LAYOUT


def setting(default: Any, why: str, **extra: Any) -> Any:
    """A dataclass field whose `help` metadata is its one line of why (flags, config show)."""
    return field(default=default, metadata={"help": why, **extra})


class SettingError(ValueError):
    """A setting out of range; `key` names it, as a flag and a config-file key do."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


def _positive(settings: Any, *keys: str) -> None:
    for key in keys:
        if not getattr(settings, key) > 0:
            raise SettingError(key, f"must be > 0, got {getattr(settings, key)!r}")


def _choices(settings: Any) -> None:
    for f in dataclasses.fields(settings):
        choices = f.metadata.get("choices")
        if choices and getattr(settings, f.name) not in choices:
            raise SettingError(f.name, f"must be one of {', '.join(choices)}, got {getattr(settings, f.name)!r}")


@dataclass(frozen=True)
class WorkerSettings:
    """How every worker schedules, caches and computes (one model's engine)."""

    max_num_seqs: int = setting(8, "sequences decoded together; more raises throughput and memory use")
    max_queue: int = setting(64, "requests a worker holds waiting for a slot before it refuses new ones")
    prefill_chunk_tokens: int = setting(
        512,
        "prompt tokens prefilled per step at most, so decoding of other requests keeps moving during a long "
        "prompt; fewer where the measured prefill speed would make a step last more than ~4 s",
    )
    batch_window_ms: int = setting(
        10,
        "when nothing is running, how long the first prompt of a burst waits for the rest to arrive, so "
        "they are prefilled together (0: never wait)",
    )
    block_tokens: int = setting(256, "tokens per prefix-cache block (only full blocks are cached)")
    prefix_cache: bool = setting(
        True, "reuse computed prompt prefixes across requests; off only to measure what the cache saves")
    max_context_tokens: int = setting(0, "cap on prompt + output tokens; 0 means the model's own context length")
    max_prompt_tokens: int = setting(
        0, "most prompt tokens one request may hold (400, as a prompt over the context window is); 0: the window "
        "alone limits it")
    max_output_tokens: int = setting(
        4096,
        "most tokens one request may generate: a request without max_tokens gets the rest of the context window "
        "up to this, a larger max_tokens is clamped to it (so an agent that never says when to stop cannot hold "
        "a slot for the whole window)")
    dtype: str = setting(
        "auto", "weight dtype the worker computes in; auto picks the fastest for the device", choices=DTYPES)
    breakpoint_pin_share: float = setting(
        0.5, "most of a worker's hot tier that clients' cache breakpoints (Anthropic cache_control) may pin, "
        "0-1; beyond it the least recently used breakpoints lapse early, so pins never crowd out new blocks")
    prompt_layout: str = setting(
        STABLE_FIRST,
        "stable_first: tool definitions before the system text where the chat template puts both in the system "
        "turn, so a session in another project (another system text, the same tools) reuses the tools from the "
        "prefix cache; template: exactly as the chat template renders", choices=PROMPT_LAYOUTS)
    speculation: str = setting(
        PROMPT_LOOKUP,
        "prompt_lookup: greedy answers draft tokens from earlier text of the conversation (an edit repeats the file "
        "it was given) and verify several in one step, the tokens unchanged; draft_model: the same, and where "
        "nothing repeats the model's draft_model drafts (prompt lookup where a model has none); off: one token "
        "a step",
        choices=SPECULATIONS)
    mlx_cache_mb: int = setting(
        256, "freed MLX buffers a worker keeps for reuse (MB); beyond this they go back to the system, and all go "
        "back whenever the worker falls idle, so a worker's RSS follows what it holds live")

    def check(self) -> None:
        """Raise `SettingError` naming the first setting out of range."""
        _positive(self, "max_num_seqs", "max_queue", "prefill_chunk_tokens", "block_tokens", "max_output_tokens")
        if self.mlx_cache_mb < 0:
            raise SettingError("mlx_cache_mb", f"must be >= 0, got {self.mlx_cache_mb!r}")
        for key in ("batch_window_ms", "max_context_tokens", "max_prompt_tokens"):
            if getattr(self, key) < 0:
                raise SettingError(key, f"must be >= 0, got {getattr(self, key)!r}")
        if not 0.0 <= self.breakpoint_pin_share <= 1.0:
            raise SettingError("breakpoint_pin_share", f"must be between 0 and 1, got {self.breakpoint_pin_share!r}")
        _choices(self)


@dataclass(frozen=True)
class KVStoreSettings:
    """How the kvstore keeps the cold tier on disk."""

    max_disk_bytes: int = setting(10 << 30, "disk cap of the cold tier; least recently used blocks go first")
    segment_bytes: int = setting(
        64 << 20, "size of one SSD segment file; disk use stays within max_disk_bytes + one segment")
    compression: str = setting("lz4", "compression of SSD blocks", choices=COMPRESSIONS)
    max_pending_bytes: int = setting(
        256 << 20, "bytes of SSD writes waiting for the disk before new ones are dropped (never waited on)")

    def check(self) -> None:
        """Raise `SettingError` naming the first setting out of range."""
        _positive(self, "max_disk_bytes", "max_pending_bytes")
        if self.segment_bytes < 4096:
            raise SettingError("segment_bytes", f"must be at least 4096, got {self.segment_bytes}")
        if self.max_disk_bytes < 2 * self.segment_bytes:
            raise SettingError("max_disk_bytes", f"must be at least twice segment_bytes ({self.segment_bytes}), "
                               f"got {self.max_disk_bytes}")
        _choices(self)
