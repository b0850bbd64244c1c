"""The rules the router's settings must satisfy beyond their types: each bad value is a
ConfigError naming its key. `RouterConfig.__post_init__` hands each rule the settings it
reads, so a typo stops the start or a reload instead of misbehaving later.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Iterable, Mapping
from typing import Any

from protocol.settings import DRAFT_MODEL, SPECULATIONS
from router.config_values import ConfigError, quote_key
from router.model_aliases import DEFAULT_TARGET
from router.model_settings import ModelSettings
from router.profiles import Profile, check_model_name, check_profile, split_model_name

POSITIVE = ("sse_keepalive_s", "max_body_bytes", "max_messages", "max_images", "max_image_bytes", "stream_send_timeout_s", "heartbeat_s",
            "ping_timeout_s", "load_timeout_s", "restart_backoff_s", "restart_backoff_max_s", "max_start_failures")
NON_NEGATIVE = ("hot_tier_bytes", "shutdown_drain_s", "kill_after_s", "memory_budget_bytes", "idle_timeout_s",
                "log_max_bytes")
_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/?#@\s]+", re.IGNORECASE)


def check_values(fields: Iterable[dataclasses.Field], values: Mapping[str, Any]) -> None:
    """The bounds of the numeric settings and the `choices` of the others; `values` is the
    config's own fields by name."""
    for key in POSITIVE:
        if not values[key] > 0:
            raise ConfigError(key, f"must be > 0, got {values[key]!r}")
    if values["log_backups"] < 1:
        raise ConfigError("log_backups", f"must be >= 1, got {values['log_backups']}")
    for key in NON_NEGATIVE:
        if values[key] < 0:
            raise ConfigError(key, f"must be >= 0, got {values[key]!r}")
    if not 0 < values["port"] < 65536:
        raise ConfigError("port", f"must be between 1 and 65535, got {values['port']}")
    heartbeat_s = values["heartbeat_s"]
    for key in ("ping_timeout_s", "kvstore_ping_timeout_s"):
        if values[key] <= heartbeat_s:
            raise ConfigError(key, f"must exceed heartbeat_s ({heartbeat_s}), got {values[key]}")
    for f in fields:
        choices = f.metadata.get("choices")
        if choices and values[f.name] not in choices:
            raise ConfigError(f.name, f"must be one of {', '.join(choices)}, got {values[f.name]!r}")


def is_loopback(host: str) -> bool:
    """True if binding `host` keeps the service reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a hostname: it may resolve to anything
        return False


def check_keys(host: str, api_key: str | None, admin_key: str | None, api_keys: Mapping[str, str],
               has_keys: bool) -> None:
    """No empty key, and no address beyond loopback without one."""
    for key, value in (("api_key", api_key), ("admin_key", admin_key)):
        if value is not None and not value.strip():
            raise ConfigError(key, "must not be empty")
    for name, secret in api_keys.items():
        if not name.strip() or not secret.strip():
            raise ConfigError(f"api_keys.{quote_key(name)}", "neither a key's name nor the key may be empty")
    if not is_loopback(host) and not has_keys:
        raise ConfigError(
            "api_key",
            f"binding {host!r} exposes the models to the network; set an API key "
            "(--api-key, --api-key-file or --admin-key) or bind 127.0.0.1",
        )


def check_web(allowed_hosts: Iterable[str], cors_origins: Iterable[str]) -> None:
    """Hosts are bare names and origins are what browsers send (no path, no trailing slash):
    anything else would never match a request, and the user would not learn why."""
    for name in allowed_hosts:
        if not name or any(char in name for char in "/@ \t") or name.count(":") == 1:
            raise ConfigError("allowed_hosts", f"{name!r} is not a host name: give the name alone, "
                              "without scheme, port or path (e.g. mybox.local)")
    for origin in cors_origins:
        if origin != "*" and not _ORIGIN.fullmatch(origin):
            raise ConfigError("cors_origins", f"{origin!r} is not an origin: write scheme://host[:port] "
                              "with no path or trailing slash (e.g. http://localhost:3000)")


def check_models(pin: Iterable[str], models: Mapping[str, ModelSettings], max_disk_bytes: int) -> None:
    """Model names, each `[models."NAME"]` table's values, and aliases that name one model each
    (`max_disk_bytes`: the cold tier's cap, which no model's share may exceed)."""
    for name in pin:
        check_model_name("pin", name)
    owner = {name: name for name in models}  # every name clients may use -> the model it means
    for name, settings in models.items():
        where = f"models.{quote_key(name)}"
        check_model_name(where, name)
        if settings.ttl_s is not None and settings.ttl_s < 0:
            raise ConfigError(f"{where}.ttl_s", f"must be >= 0, got {settings.ttl_s!r}")
        if settings.max_disk_bytes is not None and not 0 < settings.max_disk_bytes <= max_disk_bytes:
            raise ConfigError(f"{where}.max_disk_bytes", f"must be > 0 and <= max_disk_bytes "
                              f"({max_disk_bytes}), got {settings.max_disk_bytes}")
        if settings.max_output_tokens is not None and settings.max_output_tokens < 1:
            raise ConfigError(f"{where}.max_output_tokens", f"must be >= 1, got {settings.max_output_tokens}")
        if settings.speculation is not None and settings.speculation not in SPECULATIONS:
            raise ConfigError(f"{where}.speculation", f"must be one of {', '.join(SPECULATIONS)}, "
                              f"got {settings.speculation!r}")
        if settings.speculation == DRAFT_MODEL and settings.draft_model is None:
            raise ConfigError(f"{where}.speculation", "draft_model speculation needs the model's draft_model")
        if settings.draft_model is not None:
            check_model_name(f"{where}.draft_model", settings.draft_model)
            if settings.draft_model == name:
                raise ConfigError(f"{where}.draft_model", "a model cannot draft for itself")
        for alias in settings.aliases:
            check_model_name(f"{where}.aliases", alias)
            if owner.setdefault(alias, name) != name:
                raise ConfigError(f"{where}.aliases", f"{alias!r} already names model {owner[alias]!r}")


def check_profiles(profiles: Mapping[str, Profile], model_aliases: Mapping[str, str]) -> None:
    """Each profile, and each `model_aliases` target: a model name or a configured profile
    (whether that model exists is only known once the model directory is read, so the
    pool checks it at start)."""
    for name, profile in profiles.items():
        check_profile(name, profile)
    for pattern, target in model_aliases.items():
        where = f"model_aliases.{quote_key(pattern)}"
        if not pattern.strip():
            raise ConfigError("model_aliases", "a pattern must not be empty")
        if target == DEFAULT_TARGET:
            continue
        model, profile_name = split_model_name(target)
        check_model_name(where, model)
        if profile_name is not None and target not in profiles:
            raise ConfigError(where, f"{target!r} names no profile; define [profiles.{quote_key(target)}] "
                              f"or give a model name")
