"""The router's configuration: one frozen dataclass, built from defaults < (config file) < flags.

Every field is a setting with a default that is safe on a developer's laptop; its `help`
metadata is the one line of why, shown by `mlxd serve --help`. The CLI derives one flag
per field, and a config file (later) will map its keys onto the same names.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
DTYPES = ("auto", "float32", "float16", "bfloat16")


def default_home() -> Path:
    """Where mlxd keeps models and caches: $MLXD_HOME, else ~/.mlxd."""
    return Path(os.environ.get("MLXD_HOME") or Path.home() / ".mlxd")


def _setting(default: Any, why: str, **extra: Any) -> Any:
    return field(default=default, metadata={"help": why, **extra})


class ConfigError(ValueError):
    """An invalid setting; `key` names the field (the CLI shows it as `--key-name`)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


@dataclass(frozen=True)
class RouterConfig:
    """Everything the router process runs with, passed explicitly; never mutated.

    Worker-side knobs (`max_num_seqs` …) are copied into `protocol.WorkerConfig` at each
    spawn, so a restarted worker runs with exactly the same settings.
    """

    # --- HTTP
    host: str = _setting(
        "127.0.0.1",
        "address to bind; loopback by default so nothing else on the network can reach the models",
    )
    port: int = _setting(8000, "TCP port of the OpenAI-compatible API")
    api_key: str | None = _setting(
        None,
        "require 'Authorization: Bearer KEY' on every route but /health; mandatory for a non-loopback "
        "--host (or set $MLXD_API_KEY, which ps does not show)",
    )
    sse_keepalive_s: float = _setting(
        10.0,
        "seconds of silence on a stream before an SSE comment is sent, so clients don't time out during "
        "a long prefill",
    )
    max_body_bytes: int = _setting(64 << 20, "largest request body accepted (413 above it)")
    # --- models
    home: Path = field(
        default_factory=default_home,
        metadata={"help": "mlxd's data directory: models, caches (default $MLXD_HOME or ~/.mlxd)"},
    )
    model: str | None = _setting(
        None,
        "MLX model directory, .gguf file (converted once into HOME/models) or a model name in "
        "--model-dir; default: the provisioned SmolLM2-135M-Instruct",
    )
    model_dir: Path | None = _setting(None, "where model names are looked up (default HOME/models)")
    # --- worker (sent to it in the handshake)
    max_num_seqs: int = _setting(8, "sequences decoded together; more raises throughput and memory use")
    max_queue: int = _setting(64, "requests a worker holds waiting for a slot before it refuses new ones")
    prefill_chunk_tokens: int = _setting(
        512,
        "prompt tokens prefilled per step, so decoding of other requests keeps moving during a long "
        "prompt",
    )
    block_tokens: int = _setting(256, "tokens per prefix-cache block (only full blocks are cached)")
    prefix_cache: bool = _setting(True, "reuse computed prompt prefixes across requests; off only to measure what the cache saves")
    cold_cache: bool = _setting(True, "keep prefix blocks on disk too (the kvstore process), so they survive memory pressure and restarts")
    cold_cache_dir: Path | None = _setting(None, "where the SSD tier keeps its segments and index (default HOME/kvcache)")
    max_disk_bytes: int = _setting(10 << 30, "disk cap of the SSD tier; least recently used blocks go first")
    segment_bytes: int = _setting(64 << 20, "size of one SSD segment file; disk use stays within max_disk_bytes + one segment")
    compression: str = _setting("lz4", "compression of SSD blocks", choices=("lz4", "none"))
    hot_cache_bytes: int = _setting(0, "in-memory prefix cache budget per worker in bytes; 0 lets the worker choose")
    max_context_tokens: int = _setting(0, "cap on prompt + output tokens; 0 means the model's own context length")
    default_max_tokens: int = _setting(512, "output cap for requests that set no max_tokens")
    dtype: str = _setting(
        "auto",
        "weight dtype the worker computes in; auto picks the fastest for the device",
        choices=DTYPES,
    )
    # --- supervision
    heartbeat_s: float = _setting(2.0, "seconds between pings to each worker")
    ping_timeout_s: float = _setting(
        60.0,
        "a worker silent this long is hung and gets killed; long, because one big prefill chunk blocks "
        "its loop for seconds",
    )
    load_timeout_s: float = _setting(600.0, "longest a worker may take from spawn to READY (loading weights)")
    restart_backoff_s: float = _setting(
        1.0,
        "first delay before restarting a dead worker; doubles per consecutive failure",
    )
    restart_backoff_max_s: float = _setting(30.0, "cap on the restart delay")
    max_start_failures: int = _setting(
        5,
        "consecutive failed restarts before a worker is left down (see /health last_error)",
    )
    shutdown_drain_s: float = _setting(5.0, "on shutdown, how long in-flight requests may finish before they are cut")
    kill_after_s: float = _setting(5.0, "after SIGTERM, how long a worker gets to exit before SIGKILL")
    # --- logging
    log_level: str = _setting("info", "router log verbosity", choices=LOG_LEVELS)

    def __post_init__(self) -> None:
        _check(self)

    @property
    def kv_cache_dir(self) -> Path:
        """Directory of the SSD tier (segments + index)."""
        return self.cold_cache_dir if self.cold_cache_dir is not None else self.home / "kvcache"

    @property
    def models_dir(self) -> Path:
        """Directory model names resolve in, and where .gguf files are converted to."""
        return self.model_dir if self.model_dir is not None else self.home / "models"


def is_loopback(host: str) -> bool:
    """True if binding `host` keeps the service reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a hostname: it may resolve to anything
        return False


def _check(config: RouterConfig) -> None:
    positive = ("sse_keepalive_s", "max_body_bytes", "max_num_seqs", "max_queue", "prefill_chunk_tokens",
                "block_tokens", "default_max_tokens", "max_disk_bytes", "segment_bytes", "heartbeat_s", "ping_timeout_s", "load_timeout_s",
                "restart_backoff_s", "restart_backoff_max_s", "max_start_failures")
    for key in positive:
        if not getattr(config, key) > 0:
            raise ConfigError(key, f"must be > 0, got {getattr(config, key)!r}")
    for key in ("hot_cache_bytes", "max_context_tokens", "shutdown_drain_s", "kill_after_s"):
        if getattr(config, key) < 0:
            raise ConfigError(key, f"must be >= 0, got {getattr(config, key)!r}")
    if not 0 < config.port < 65536:
        raise ConfigError("port", f"must be between 1 and 65535, got {config.port}")
    if config.ping_timeout_s <= config.heartbeat_s:
        raise ConfigError("ping_timeout_s", f"must exceed heartbeat_s ({config.heartbeat_s}), got {config.ping_timeout_s}")
    for f in dataclasses.fields(config):
        choices = f.metadata.get("choices")
        if choices and getattr(config, f.name) not in choices:
            raise ConfigError(f.name, f"must be one of {', '.join(choices)}, got {getattr(config, f.name)!r}")
    if config.api_key is not None and not config.api_key.strip():
        raise ConfigError("api_key", "must not be empty")
    if not is_loopback(config.host) and config.api_key is None:
        raise ConfigError(
            "api_key",
            f"binding {config.host!r} exposes the models to the network; set an API key "
            "(--api-key) or bind 127.0.0.1",
        )


def setting_types() -> dict[str, type]:
    """Field name -> the plain type its value is parsed as (str, int, float, Path)."""
    types: dict[str, type] = {}
    for name, hint in typing.get_type_hints(RouterConfig).items():
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        types[name] = args[0] if args else hint
    return types


def _parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise ValueError(value)


def make_config(overrides: Mapping[str, Any] | None = None) -> RouterConfig:
    """Defaults < `overrides` (config file values, then CLI flags, merged by the caller).

    Values may be strings (as from a command line); each is converted to the field's type.
    An unknown key or an unparsable value raises `ConfigError` naming the key.
    """
    types = setting_types()
    kwargs: dict[str, Any] = {}
    for key, value in (overrides or {}).items():
        if key not in types:
            raise ConfigError(key, "unknown setting")
        if value is None:
            kwargs[key] = None
            continue
        kind = types[key]
        try:
            if kind is bool:
                kwargs[key] = _parse_bool(value)
                continue
            if kind is int and isinstance(value, float) or isinstance(value, bool):
                raise ValueError
            kwargs[key] = kind(value)
        except (TypeError, ValueError):
            raise ConfigError(key, f"expected {kind.__name__}, got {value!r}") from None
    return RouterConfig(**kwargs)
