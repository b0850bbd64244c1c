"""The router's configuration: one frozen dataclass, built from defaults < config file < flags.

Every field is a setting with a default that is safe on a developer's laptop; its `help`
metadata is the one line of why, shown by `mlxd serve --help`. The CLI derives one flag
per scalar field and `router.config_file` reads the same names as TOML keys. The two
tables, `models` (per-model settings) and `profiles` (named request defaults sharing a
model's engine), exist in the config file only.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from protocol.settings import KVStoreSettings, SettingError, WorkerSettings
from router import config_checks
from router.config_values import (
    ConfigError,
    FrozenMap,
    normalize_fields,
    parse_bool,
    setting,
    type_hints,
    unknown_key_message,
)
from router.model_aliases import DEFAULT_MODEL_ALIASES, DEFAULT_TARGET
from router.model_settings import ModelSettings
from router.profiles import Profile

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
TABLES = ("models", "profiles")  # settings that are TOML tables, so they exist in the config file only
# the children's settings, embedded whole; their fields are flags and top-level keys
SECTIONS: dict[str, type] = {"worker": WorkerSettings, "kvstore": KVStoreSettings}
# settings renamed when the cold tier, hot tier and kvstore got one name each:
# the old config keys and flags still work, with a warning, and go in 0.2
RENAMED_SETTINGS: Mapping[str, str] = {
    "cold_cache": "cold_tier",
    "cold_cache_dir": "kvstore_dir",
    "hot_cache_bytes": "hot_tier_bytes",
    # was the limit of requests without max_tokens; those now get the window, up to this cap
    "default_max_tokens": "max_output_tokens",
}
MEMORY_RESERVE_BYTES = 8 << 30  # what the automatic memory budget leaves to the OS and other apps
MIN_MEMORY_BUDGET_BYTES = 2 << 30  # the automatic budget never goes below this, even on a small machine

def default_home() -> Path:
    """Where mlxd keeps models and caches: $MLXD_HOME, else ~/.mlxd."""
    return Path(os.environ.get("MLXD_HOME") or Path.home() / ".mlxd")


@dataclass(frozen=True)
class RouterConfig:
    """Everything the router process runs with, passed explicitly; never mutated.

    Worker-side knobs (`max_num_seqs` …) are copied into `protocol.WorkerConfig` at each
    spawn, so a restarted worker runs with exactly the same settings.
    """

    # --- the config file (its own location can only come from the command line)
    config: Path | None = setting(
        None,
        "TOML file of settings, overridden by flags (default HOME/config.toml, skipped if missing)",
        cli_only=True,
    )
    # --- HTTP
    host: str = setting(
        "127.0.0.1",
        "address to bind; loopback by default so nothing else on the network can reach the models",
    )
    port: int = setting(8000, "TCP port of the OpenAI-compatible API")
    api_key: str | None = setting(
        None,
        "require 'Authorization: Bearer KEY' on every route but /health; mandatory for a non-loopback "
        "--host (or set $MLXD_API_KEY, which ps does not show); logged as key 'default'",
    )
    api_keys: Mapping[str, str] = field(
        default_factory=FrozenMap,
        metadata={"help": "more API keys, each with a name that logs and /admin/status show (never the key): "
                          "NAME=KEY; in the config file an [api_keys] table; repeat the flag for more",
                  "repeatable": True},
    )
    api_key_file: Path | None = setting(
        None, "file of API keys, one 'NAME KEY' per line (# comments); re-read on reload (SIGHUP)"
    )
    admin_key: str | None = setting(
        None,
        "key for /admin/* (and every other route); once set, the other keys get 403 on /admin/* "
        "(or set $MLXD_ADMIN_KEY, which ps does not show)",
    )
    sse_keepalive_s: float = setting(
        10.0,
        "seconds of silence on a stream before a keep-alive is sent (an SSE comment; a ping and an empty "
        "delta on Messages; response.in_progress on Responses), so clients don't time out during a long prefill",
    )
    max_body_bytes: int = setting(
        8 << 20,
        "largest request body accepted (413 above it); 8 MiB holds a 1M-token conversation's text, and a "
        "bigger body only costs memory and time",
    )
    max_messages: int = setting(
        10_000,
        "most messages (or Responses input items, history included) one request may hold (400 above it); a "
        "long agent session has hundreds, and each one costs the template renderer time",
    )
    allow_image_urls: bool = setting(
        False,
        "fetch an image given by an http(s) URL (off: only data: URLs and base64 images are taken; a prompt "
        "that names a URL would otherwise make this server reach out for it)",
    )
    max_images: int = setting(8, "most images one request may hold (400 above it)")
    max_image_bytes: int = setting(20 << 20, "largest image accepted, in bytes once decoded (400 above it)")
    stream_send_timeout_s: float = setting(
        60.0,
        "how long a write to a client may wait for it to read (a stalled client holds at most the socket's "
        "buffers); past it the request is cancelled, so its decode slot goes to others",
    )
    generated_calls: str = setting(
        "markup",
        "how a tool call the model made comes back in the next turn's prompt: markup = as the model's own tokens "
        "when it wrote the template's call markup (the prefix cache then keeps the whole turn), else from the "
        "call in the right form; always = as its own tokens however it wrote the call (more cache hits, but a "
        "small model that wrote a bare JSON call sees that form in its history and repeats it); never = from "
        "the call, as the template renders it",
        choices=("markup", "always", "never"),
    )
    normalize_billing_header: bool = setting(
        True,
        "drop the per-request billing line Claude Code puts first in its system prompt "
        "('x-anthropic-billing-header: ...') before rendering, so the rest of the prompt keeps hitting the "
        "prefix cache",
    )
    allowed_hosts: tuple[str, ...] = setting(
        (), "Host names accepted without an API key besides loopback names and --host (a DNS-rebinding guard); "
        "'*' accepts any; repeat the flag for more", repeatable=True
    )
    cors_origins: tuple[str, ...] = setting(
        (), "web page origins (scheme://host[:port]) allowed to call the API from a browser, answered with CORS "
        "headers; '*' for any; repeat the flag for more", repeatable=True
    )
    # --- models
    home: Path = field(
        default_factory=default_home,
        metadata={"help": "mlxd's data directory: models, caches (default $MLXD_HOME or ~/.mlxd)"},
    )
    model: str | None = setting(
        None,
        "MLX model directory, .gguf file (converted once into HOME/models) or a model name in "
        "--model-dir; default: the provisioned SmolLM2-135M-Instruct",
    )
    model_dir: Path | None = setting(None, "where model names are looked up (default HOME/models)")
    embedding_model: str = setting(
        "all-MiniLM-L6-v2",
        "the embedding model /v1/models lists from the start, fetched into the model dir on its first use "
        "(/v1/embeddings, /v1/rerank); a name mlxd can pull; '' lists none beyond those in the model dir",
    )
    memory_budget_bytes: int = setting(
        0,
        "memory all loaded models may use together; over it, idle unpinned models are unloaded; 0: total "
        "RAM minus 8 GB for the OS and apps, at least 2 GB",
    )
    idle_timeout_s: float = setting(
        0.0, "unload a model idle this many seconds, giving its memory back; 0: never (models.NAME.ttl_s overrides)"
    )
    pin: tuple[str, ...] = setting(
        (), "model kept loaded at all times, never evicted or unloaded; repeat the flag for more", repeatable=True
    )
    models: Mapping[str, ModelSettings] = field(
        default_factory=FrozenMap,
        metadata={"help": 'per-model settings, the config file\'s [models."NAME"] tables', "table": True},
    )
    profiles: Mapping[str, Profile] = field(
        default_factory=FrozenMap,
        metadata={"help": 'named request defaults sharing a model\'s engine, [profiles."MODEL:PROFILE"] tables',
                  "table": True},
    )
    model_aliases: Mapping[str, str] = field(
        default_factory=lambda: FrozenMap(DEFAULT_MODEL_ALIASES),
        metadata={"help": "glob pattern -> model (or MODEL:PROFILE) for names no model or alias has, first match "
                          f"wins; '{DEFAULT_TARGET}' is the first --model (or pinned model); a flag takes "
                          "PATTERN=MODEL and may repeat; setting it replaces the default "
                          f"(claude-*={DEFAULT_TARGET}, so Claude Code works unconfigured)",
                  "repeatable": True},
    )
    # --- the children: each setting is defined once in protocol.settings; a flag and a
    # config-file key of its own name (`max_num_seqs`), sent whole in the handshake
    worker: WorkerSettings = field(
        default_factory=WorkerSettings,
        metadata={"help": "what every worker runs with (protocol.settings.WorkerSettings)", "section": True},
    )
    cold_tier: bool = setting(
        True, "the cold tier: keep prefix blocks on disk too (in the kvstore process), so they survive memory "
              "pressure and restarts")
    kvstore_dir: Path | None = setting(None, "where the kvstore keeps the cold tier's segments and index (default HOME/kvcache)")
    kvstore: KVStoreSettings = field(
        default_factory=KVStoreSettings,
        metadata={"help": "what the kvstore runs with (protocol.settings.KVStoreSettings)", "section": True},
    )
    hot_tier_bytes: int = setting(
        0, "the hot tier's budget per worker in bytes (prefix blocks in the worker's memory); 0 means an eighth of "
           "the memory budget (at least 256 MB)")
    # --- supervision
    heartbeat_s: float = setting(2.0, "seconds between pings to each worker and the kvstore")
    ping_timeout_s: float = setting(
        60.0,
        "a worker silent this long is hung and gets killed; long, because one big prefill chunk blocks "
        "its loop for seconds",
    )
    kvstore_ping_timeout_s: float = setting(
        10.0,
        "the kvstore (pinged every heartbeat_s) silent this long is hung and gets killed and restarted; shorter "
        "than ping_timeout_s since its loop only moves bytes, never computes, yet ample for one flooded with writes",
    )
    load_timeout_s: float = setting(600.0, "longest a worker may take from spawn to READY (loading weights)")
    restart_backoff_s: float = setting(
        1.0,
        "first delay before restarting a dead worker; doubles per consecutive failure",
    )
    restart_backoff_max_s: float = setting(30.0, "cap on the restart delay")
    max_start_failures: int = setting(
        5,
        "consecutive failed restarts before a worker is left down (see /health last_error)",
    )
    shutdown_drain_s: float = setting(5.0, "on shutdown, how long in-flight requests may finish before they are cut")
    kill_after_s: float = setting(5.0, "after SIGTERM, how long a worker gets to exit before SIGKILL")
    # --- logging
    log_level: str = setting("info", "router log verbosity", choices=LOG_LEVELS)
    log_format: str = setting(
        "text", "log lines on stderr and in the files: text for people ('date time LEVEL role logger: message'), "
                "json for machines (one object per line: ts, level, role, logger, msg, request_id, exc)",
        choices=("text", "json"))
    log_files: bool = setting(
        True, "each process also logs to its own rotating file in log_dir (router.log, kvstore.log, "
              "worker-MODEL.log), read by `mlxd logs`, so a background service's logs outlive its terminal")
    log_dir: Path | None = setting(None, "where the log files go (default HOME/logs)")
    log_max_bytes: int = setting(
        10 << 20, "size at which a log file is rotated (renamed .1, the older ones shifted up); 0: never")
    log_backups: int = setting(5, "rotated files kept per log file (at least 1); the oldest beyond is deleted")

    def __post_init__(self) -> None:
        normalize_fields(self, {"models": ModelSettings, "profiles": Profile}, SECTIONS)
        _check(self)

    @property
    def kvstore_root(self) -> Path:
        """Directory of the cold tier (segments + index)."""
        return self.kvstore_dir if self.kvstore_dir is not None else self.home / "kvcache"

    @property
    def has_keys(self) -> bool:
        """Whether any API key is configured (then every route but the probes needs one)."""
        return bool(self.api_key or self.api_keys or self.api_key_file or self.admin_key)

    @property
    def models_dir(self) -> Path:
        """Directory model names resolve in, and where .gguf files are converted to."""
        return self.model_dir if self.model_dir is not None else self.home / "models"

    @property
    def effective_memory_budget_bytes(self) -> int:
        """Bytes all loaded models may use together: the setting, or when it is 0 a share of
        this machine's RAM (see `auto_memory_budget`)."""
        if self.memory_budget_bytes > 0:
            return self.memory_budget_bytes
        return auto_memory_budget(psutil.virtual_memory().total)

    @property
    def pinned(self) -> frozenset[str]:
        """Models never unloaded: those of `pin` plus those with `pin = true` in their table."""
        return frozenset(self.pin) | {name for name, settings in self.models.items() if settings.pin}

    @property
    def alias_targets(self) -> Mapping[str, str]:
        """Alias -> the model it names, from every `[models."NAME"]` table."""
        return {alias: name for name, settings in self.models.items() for alias in settings.aliases}

    def settings_for(self, model: str) -> ModelSettings:
        """The `[models."NAME"]` settings of `model`, or the defaults if it has no table."""
        return self.models.get(model) or ModelSettings()

    def ttl_for(self, model: str) -> float:
        """Idle seconds after which `model` is unloaded (0: never); its own ttl_s wins."""
        ttl = self.settings_for(model).ttl_s
        return self.idle_timeout_s if ttl is None else ttl

    def output_cap_for(self, model: str, profile: Profile | None) -> int | None:
        """The tightest of `model`'s and `profile`'s max_output_tokens (None: neither sets
        one, the worker's own max_output_tokens applies)."""
        caps = [cap for cap in (self.settings_for(model).max_output_tokens,
                                profile.max_output_tokens if profile is not None else None) if cap is not None]
        return min(caps) if caps else None


def auto_memory_budget(total_bytes: int) -> int:
    """The default memory budget on a machine with `total_bytes` of RAM: all of it but
    MEMORY_RESERVE_BYTES for the OS and other apps, and never below MIN_MEMORY_BUDGET_BYTES."""
    return max(total_bytes - MEMORY_RESERVE_BYTES, MIN_MEMORY_BUDGET_BYTES)


def _check(config: RouterConfig) -> None:
    """Raise ConfigError naming the first bad value: each child's section checks itself,
    `router.config_checks` holds the router's own rules."""
    for section in SECTIONS:
        try:
            getattr(config, section).check()
        except SettingError as exc:
            raise ConfigError(exc.key, exc.message) from None
    fields = dataclasses.fields(config)
    config_checks.check_values(fields, {f.name: getattr(config, f.name) for f in fields})
    config_checks.check_keys(config.host, config.api_key, config.admin_key, config.api_keys, config.has_keys)
    config_checks.check_web(config.allowed_hosts, config.cors_origins)
    config_checks.check_models(config.pin, config.models, config.kvstore.max_disk_bytes)
    config_checks.check_profiles(config.profiles, config.model_aliases)


def setting_fields() -> dict[str, dataclasses.Field]:
    """Every setting a flag or a top-level config-file key sets, name -> its field: the
    router's own, and each child's (`SECTIONS`) in the place of its section, flat
    (`max_num_seqs`, not `worker.max_num_seqs`). The tables are left out."""
    out: dict[str, dataclasses.Field] = {}
    for f in dataclasses.fields(RouterConfig):
        if f.name in SECTIONS:
            out.update((g.name, g) for g in dataclasses.fields(SECTIONS[f.name]))
        elif f.name not in TABLES:
            out[f.name] = f
    return out


SECTION_OF: dict[str, str] = {f.name: name for name, cls in SECTIONS.items() for f in dataclasses.fields(cls)}


def setting_hints() -> dict[str, Any]:
    """Every key a flag or the config file may set -> its type hint (tables included)."""
    hints = {name: hint for name, hint in type_hints(RouterConfig).items() if name not in SECTIONS}
    for cls in SECTIONS.values():
        hints.update(type_hints(cls))
    return hints


def setting_value(config: RouterConfig, name: str) -> Any:
    """The value of flat setting `name` in `config` (a child's lives in its section)."""
    section = SECTION_OF.get(name)
    return getattr(getattr(config, section), name) if section else getattr(config, name)


def setting_types() -> dict[str, type]:
    """Scalar setting name -> the plain type one value parses as (str, int, float, bool, Path).

    For a repeatable setting (`pin`) it is the type of one item. The tables (TABLES) are
    left out: they have no flag and are not plain values.
    """
    kinds: dict[str, type] = {}
    for name, hint in setting_hints().items():
        if name in TABLES:
            continue
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        kinds[name] = args[0] if args else hint
    return kinds


def make_config(overrides: Mapping[str, Any] | None = None) -> RouterConfig:
    """Defaults < `overrides` (config file values, then CLI flags, merged by the caller).

    Scalar values may be strings (as from a command line); each is converted to the
    field's type. `pin` takes a list of names; `models` and `profiles` take mappings of
    plain dicts (as TOML gives them) or of `ModelSettings` / `Profile`. An unknown key or a
    bad value raises `ConfigError` naming the key.
    """
    kinds = setting_types()
    hints = setting_hints()
    kwargs: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    for key, value in (overrides or {}).items():
        if key not in hints:
            raise ConfigError(key, unknown_key_message(key, list(hints)))
        target = sections[SECTION_OF[key]] if key in SECTION_OF else kwargs
        if value is None or key in TABLES or typing.get_origin(hints[key]) in (tuple, Mapping):
            target[key] = value  # checked by RouterConfig itself
            continue
        kind = kinds[key]
        try:
            if kind is bool:
                target[key] = parse_bool(value)
                continue
            if kind is int and isinstance(value, float) or isinstance(value, bool):
                raise ValueError
            target[key] = kind(value)
        except (TypeError, ValueError):
            raise ConfigError(key, f"expected {kind.__name__}, got {value!r}") from None
    for name, values in sections.items():
        if values:
            kwargs[name] = values  # RouterConfig builds the section and type-checks each value
    return RouterConfig(**kwargs)
