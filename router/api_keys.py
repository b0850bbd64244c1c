"""The service's API keys: each has a name, which logs and /admin/status show, never the key.

Keys come from `api_key` (named "default"), the `api_keys` table (NAME = KEY), the file
named by `api_key_file` (one `NAME KEY` or `NAME = KEY` per line) and `admin_key` (named
"admin"). An admin key opens everything; with one configured, the other keys no longer
open `/admin/*`. A KeyRing is immutable: a reload builds a new one and swaps it in
(`KeyState`), so a request checks against one consistent set.
"""

from __future__ import annotations

import hmac
import logging
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from router.config import RouterConfig
from router.config_values import ConfigError

logger = logging.getLogger(__name__)

DEFAULT_NAME = "default"  # the name of `api_key`'s key
ADMIN_NAME = "admin"  # the name of `admin_key`'s key


@dataclass(frozen=True)
class ApiKey:
    name: str
    secret: str = field(repr=False)  # never printed, logged or shown
    admin: bool = False


@dataclass(frozen=True)
class KeyRing:
    """The keys in force. `keys` empty means the service is open (loopback only)."""

    keys: tuple[ApiKey, ...] = ()

    @property
    def required(self) -> bool:
        return bool(self.keys)

    @property
    def has_admin_key(self) -> bool:
        return any(key.admin for key in self.keys)

    def match(self, supplied: str | None) -> ApiKey | None:
        """The key `supplied` is, compared in constant time against every key (so the
        time taken does not tell which key, or how much of one, matched)."""
        if supplied is None:
            return None
        found = None
        for key in self.keys:
            if hmac.compare_digest(supplied.encode(), key.secret.encode()):
                found = key
        return found

    def may_administer(self, key: ApiKey) -> bool:
        """Admin routes: the admin key, or any key when no admin key is configured."""
        return key.admin or not self.has_admin_key

    def names(self) -> list[str]:
        return [key.name for key in self.keys]


def parse_key_file(path: Path) -> dict[str, str]:
    """NAME -> KEY from a key file: `NAME KEY` or `NAME = KEY` per line, `#` comments and
    blank lines ignored. Raises ConfigError naming the line that is wrong."""
    try:
        text = path.read_text()
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError("api_key_file", f"cannot read {path}: {exc.strerror or exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        logger.warning("key file %s is readable by other users (mode %o); chmod 600 it", path, mode & 0o777)
    keys: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, secret = line.partition("=") if "=" in line else line.partition(" ")
        name, secret = name.strip(), secret.strip()
        if not sep or not name or not secret or " " in secret:
            raise ConfigError("api_key_file", f"{path}:{number}: expected 'NAME KEY' or 'NAME = KEY'")
        if name in keys:
            raise ConfigError("api_key_file", f"{path}:{number}: key name {name!r} appears twice")
        keys[name] = secret
    if not keys:
        raise ConfigError("api_key_file", f"{path} holds no key")
    return keys


def key_ring(config: RouterConfig) -> KeyRing:
    """Every configured key, read now (the key file included). Raises ConfigError when a
    name is used twice or two names share one key: either would make the logs lie."""
    named: list[tuple[str, str, bool]] = []
    if config.api_key is not None:
        named.append((DEFAULT_NAME, config.api_key, False))
    named += [(name, secret, False) for name, secret in config.api_keys.items()]
    if config.api_key_file is not None:
        named += [(name, secret, False) for name, secret in parse_key_file(config.api_key_file).items()]
    if config.admin_key is not None:
        named.append((ADMIN_NAME, config.admin_key, True))
    names: set[str] = set()
    secrets: set[str] = set()
    for name, secret, _ in named:
        if name in names:
            raise ConfigError("api_keys", f"the key name {name!r} is used twice")
        if secret in secrets:
            raise ConfigError("api_keys", f"the key named {name!r} is the same key as another one")
        names.add(name)
        secrets.add(secret)
    return KeyRing(tuple(ApiKey(name, secret, admin) for name, secret, admin in named))


@dataclass
class KeyUse:
    requests: int = 0
    last_used: float | None = None


@dataclass
class KeyState:
    """The ring in force, swapped whole by a reload, and how often each key name was used
    (for /admin/status; kept across reloads, by name)."""

    ring: KeyRing
    uses: dict[str, KeyUse] = field(default_factory=dict)

    def record(self, key: ApiKey) -> None:
        use = self.uses.setdefault(key.name, KeyUse())
        use.requests += 1
        use.last_used = time.time()

    def status(self) -> list[dict[str, object]]:
        """One entry per configured key: its name, role and use; never the key."""
        return [{"name": key.name, "admin": key.admin,
                 "requests": self.uses.get(key.name, KeyUse()).requests,
                 "last_used": self.uses.get(key.name, KeyUse()).last_used} for key in self.ring.keys]


def client_key(config: RouterConfig) -> str | None:
    """The key the shell commands (`mlxd status`, `mlxd cache`) send: the admin key when
    there is one, else the first configured key; None for an open service."""
    ring = key_ring(config)
    admin = next((key for key in ring.keys if key.admin), None)
    chosen = admin or (ring.keys[0] if ring.keys else None)
    return chosen.secret if chosen is not None else None
