"""The value machinery under every settings dataclass: the field helper, strict typing of
values from files and code, read-only tables, and the error that names the bad key.

Kept apart from the settings themselves (`router.config`, `router.profiles`) so that the
schema reads as a list of settings, and profiles can use the same machinery without
importing the router's config.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from protocol.settings import setting as setting  # one field helper for every settings class

V = TypeVar("V")


def flag_name(key: str) -> str:
    """The command-line flag of setting `key` (`max_num_seqs` -> `--max-num-seqs`)."""
    return "--" + key.replace("_", "-")


def quote_key(name: str) -> str:
    """`name` as a TOML basic string, so table names with `/`, `.` or `:` stay one key."""
    short = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
    escaped = []
    for char in name:
        if char in short:
            escaped.append(short[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:  # TOML forbids raw control characters
            escaped.append(f"\\u{ord(char):04x}")
        else:
            escaped.append(char)
    return '"' + "".join(escaped) + '"'


class ConfigError(ValueError):
    """An invalid setting.

    `key` names the field (`port`, or a table entry like `profiles."smol:coder".top_p`;
    None for a file that is not TOML at all); `source` says where the bad value came
    from (a config file's path, `--flag`, `$ENV`; None for defaults and code), so the
    user is sent to the right place to fix it.
    """

    def __init__(self, key: str | None, message: str, source: str | None = None) -> None:
        super().__init__(": ".join(part for part in (source, key, message) if part))
        self.key = key
        self.message = message
        self.source = source

    def at(self, source: str | None) -> ConfigError:
        """The same error, attributed to `source`."""
        return ConfigError(self.key, self.message, source)


def unknown_key_message(key: str, known: Sequence[str]) -> str:
    """'unknown setting', with the closest known name when there is one (typos are the usual cause)."""
    underscored = key.replace("-", "_")
    if underscored != key and underscored in known:
        return f"unknown setting; did you mean {underscored!r}? (keys use underscores)"
    close = difflib.get_close_matches(key, known, n=1)
    return f"unknown setting; did you mean {close[0]!r}?" if close else "unknown setting"


class FrozenMap(Mapping[str, V]):
    """A read-only dict that also hashes and pickles, so a config holding tables stays a value."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, V] | None = None) -> None:
        self._items: dict[str, V] = dict(items or {})

    def __getitem__(self, key: str) -> V:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __repr__(self) -> str:
        return f"FrozenMap({self._items!r})"


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    """Field name -> resolved type hint of a settings dataclass (cached: built per config)."""
    return typing.get_type_hints(cls)


def _type_words(hint: Any) -> str:
    if typing.get_origin(hint) is tuple:
        return "a list of strings"
    if typing.get_origin(hint) is Mapping:
        return "a table of strings"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string",
            Path: "a path (string)"}.get(hint, getattr(hint, "__name__", str(hint)))


def strict_value(key: str, value: Any, hint: Any) -> Any:
    """`value` from a typed source (TOML, Python) checked against a field's type `hint`.

    Unlike a flag's text, a typed value is never converted: `port = "80"` in a file is a
    mistake worth naming, not a number. Lists become tuples and strings become Paths so
    the config stays immutable; ints are accepted where floats are expected.
    """
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if value is None:
            return None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if typing.get_origin(hint) is Mapping:
        return string_map(key, value)
    if typing.get_origin(hint) is tuple:
        items = [value] if isinstance(value, str) else value
        if isinstance(items, (list, tuple)) and all(isinstance(item, str) for item in items):
            return tuple(items)
    elif hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ConfigError(key, f"must be a finite number, got {value!r}")
        return float(value)
    elif hint is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    elif hint is Path and isinstance(value, (str, Path)):
        return Path(value)
    elif hint in (bool, str) and isinstance(value, hint):
        return value
    raise ConfigError(key, f"expected {_type_words(hint)}, got {value!r}")


def string_map(key: str, value: Any) -> FrozenMap[str]:
    """A setting that maps names to names, in order: a TOML table, or (from repeated
    flags) `KEY=VALUE` strings, split at the first `=`."""
    if isinstance(value, FrozenMap):
        return value
    if isinstance(value, str):
        value = [value]
    if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
        pairs = [item.partition("=") for item in value]
        bad = next((item for item, (_, equals, _) in zip(value, pairs) if not equals), None)
        if bad is not None:
            raise ConfigError(key, f"expected KEY=VALUE, got {bad!r}")
        value = {name: target for name, _, target in pairs}
    if isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        return FrozenMap(value)
    raise ConfigError(key, f"expected a table of strings (or KEY=VALUE strings), got {value!r}")


def normalize_fields(obj: Any, tables: Mapping[str, type] | None = None,
                     sections: Mapping[str, type] | None = None) -> None:
    """Type-check every field of a frozen settings dataclass, storing lists as tuples,
    `tables` (field name -> the settings class of one entry) as FrozenMaps, and `sections`
    (field name -> a settings class embedded whole, given as one or as a mapping of its
    fields), so a config built from code is as sound as one from a file."""
    for name, hint in type_hints(type(obj)).items():
        value = getattr(obj, name)
        if tables and name in tables:
            value = table(name, value, tables[name])
        elif sections and name in sections:
            value = section(value, sections[name])
        else:
            value = strict_value(name, value, hint)
        object.__setattr__(obj, name, value)


def section(raw: Any, cls: type) -> Any:
    """An embedded settings object of `cls`, each field type-checked; errors name the
    field alone (`max_num_seqs`), as flags and config-file keys do."""
    values = dataclasses.asdict(raw) if isinstance(raw, cls) else raw
    if not isinstance(values, Mapping):
        raise ConfigError(None, f"expected {cls.__name__} settings, got {raw!r}")
    hints = type_hints(cls)
    for key in values:
        if key not in hints:
            raise ConfigError(key, unknown_key_message(key, list(hints)))
    return cls(**{key: strict_value(key, value, hints[key]) for key, value in values.items()})


T = TypeVar("T")


def table(key: str, raw: Any, cls: type[T]) -> FrozenMap[T]:
    """`[models."NAME"]` / `[profiles."MODEL:PROFILE"]` tables -> name -> frozen settings.
    Errors name the exact entry, e.g. `profiles."smol:coder".temprature`."""
    if isinstance(raw, FrozenMap):
        return raw
    if not isinstance(raw, Mapping):
        raise ConfigError(key, f"must be a table of [{key}.\"NAME\"] tables, got {raw!r}")
    hints = type_hints(cls)
    entries: dict[str, T] = {}
    for name, values in raw.items():
        where = f"{key}.{quote_key(name)}"
        if isinstance(values, cls):
            entries[name] = values
            continue
        if not isinstance(values, Mapping):
            raise ConfigError(where, f"must be a table of settings, got {values!r}")
        kwargs: dict[str, Any] = {}
        for field_name, value in values.items():
            if field_name not in hints:
                raise ConfigError(f"{where}.{field_name}", unknown_key_message(field_name, list(hints)))
            kwargs[field_name] = strict_value(f"{where}.{field_name}", value, hints[field_name])
        entries[name] = cls(**kwargs)
    return FrozenMap(entries)


def parse_bool(value: Any) -> bool:
    """A flag's or an environment variable's text as a bool (true/yes/on/1, false/no/off/0)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise ValueError(value)
