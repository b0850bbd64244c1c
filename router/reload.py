"""SIGHUP and `POST /admin/reload`: read the config file again and apply what can change
while requests run.

Applied at once: pins, TTLs, profiles, aliases (`model_aliases` and per-model), output caps,
the memory budget, API keys, and the supervision timings. A model newly pinned is loaded;
models whose settings did not change are never touched. Settings a running process holds
(the address, the home, the worker's and the kvstore's settings, the cold tier's caps,
logging) keep their running value and are reported as needing a restart. A file that does
not parse or check is refused whole, with the reason, and nothing changes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from protocol.errors import RequestError
from router.api_keys import KeyState, key_ring
from router.config import RouterConfig
from router.config_file import SECRETS, load_config
from router.config_values import ConfigError
from router.model_settings import ModelSettings
from router.children.pool import WorkerPool

logger = logging.getLogger(__name__)

# held by a running process (the listener, the kvstore, each worker's handshake, the
# log handlers): a new value takes a restart of the service
RESTART_ONLY = ("host", "port", "home", "model", "model_dir", "worker", "cold_tier", "kvstore_dir",
                "kvstore", "hot_tier_bytes", "log_level", "log_format", "log_dir", "log_max_bytes", "log_backups",
                "log_files", "allowed_hosts", "cors_origins", "max_body_bytes", "stream_send_timeout_s",
                "sse_keepalive_s", "normalize_billing_header")
# per-model settings the kvstore took at its start
MODEL_RESTART_ONLY = ("max_disk_bytes",)


@dataclass
class ReloadReport:
    changed: list[str] = field(default_factory=list)  # settings now in force
    restart_required: list[str] = field(default_factory=list)  # changed in the file, not applied
    loading: list[str] = field(default_factory=list)  # newly pinned models being loaded

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class ReloadRefused(Exception):
    """The new configuration is wrong; the running one stays. str() is the reason."""


def _model_changes(old: Mapping[str, ModelSettings], new: Mapping[str, ModelSettings]) -> tuple[list[str], list[str]]:
    """(applied, restart-only) dotted names of the per-model settings that differ."""
    applied: list[str] = []
    restart: list[str] = []
    for name in sorted(set(old) | set(new)):
        before, after = old.get(name) or ModelSettings(), new.get(name) or ModelSettings()
        for f in dataclasses.fields(ModelSettings):
            if getattr(before, f.name) != getattr(after, f.name):
                (restart if f.name in MODEL_RESTART_ONLY else applied).append(f"models.{name}.{f.name}")
    return applied, restart


def plan(running: RouterConfig, loaded: RouterConfig) -> tuple[RouterConfig, ReloadReport]:
    """The configuration to run with (`loaded`, but restart-only settings keep their
    running value) and what differs."""
    report = ReloadReport()
    keep: dict[str, Any] = {}
    for f in dataclasses.fields(RouterConfig):
        before, after = getattr(running, f.name), getattr(loaded, f.name)
        if f.name == "models" or before == after:
            continue
        if f.name in RESTART_ONLY:
            report.restart_required.append(f.name)
            keep[f.name] = before
        else:
            report.changed.append(f.name)
    applied, restart = _model_changes(running.models, loaded.models)
    report.changed += applied
    report.restart_required += restart
    models = dict(loaded.models)
    for dotted in restart:  # keep the running cap of that model
        _, name, key = dotted.split(".", 2)
        before = running.models.get(name) or ModelSettings()
        models[name] = dataclasses.replace(models.get(name) or ModelSettings(), **{key: getattr(before, key)})
    return dataclasses.replace(loaded, models=models, **keep), report


class Reloader:
    """Re-reads the configuration from the same flags the service started with and applies
    it to the pool, the app and the keys. One reload at a time."""

    def __init__(self, flags: Mapping[str, Any], pool: WorkerPool, keys: KeyState,
                 on_config: Callable[[RouterConfig], None]) -> None:
        self.flags = dict(flags)
        self.pool = pool
        self.keys = keys
        self.on_config = on_config  # hands the new config to whatever else holds it (the app)
        self._lock = asyncio.Lock()

    async def reload(self) -> ReloadReport:
        """Raises ReloadRefused with the reason when the new file is wrong."""
        async with self._lock:
            running = self.pool.config
            try:
                loaded = await asyncio.to_thread(load_config, self.flags)
                config, report = plan(running, loaded.config)
                ring = await asyncio.to_thread(key_ring, config)
                self.pool.names.check_config(config)
            except ConfigError as exc:
                raise ReloadRefused(str(exc)) from None
            except RequestError as exc:
                raise ReloadRefused(exc.message) from None
            for warning in loaded.warnings:
                logger.warning("reload: %s", warning)
            if ring != self.keys.ring and "keys" not in report.changed:
                report.changed.append("keys")  # the key file's contents, or the names of keys
            self.keys.ring = ring
            report.loading = self.pool.apply_config(config)
            self.on_config(config)
            shown = [name for name in report.changed if name not in (*SECRETS, "keys")]
            secret = [name for name in report.changed if name in (*SECRETS, "keys")]
            logger.info("reloaded %s: %s%s%s", config.config or "the flags",
                        ", ".join(shown) or "nothing changed",
                        f"; keys changed ({', '.join(secret)}): now {', '.join(ring.names()) or 'none'}"
                        if secret else "",
                        f"; needs a restart to apply: {', '.join(report.restart_required)}"
                        if report.restart_required else "")
            return report
