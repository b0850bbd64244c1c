"""The TOML config file, and the layering defaults < config file < $MLXD_API_KEY (and
$MLXD_ADMIN_KEY) < flags.

The file is `HOME/config.toml`, or the one `--config PATH` names. Its keys are the
setting names (the flags without their dashes, in snake_case):

    port = 8080
    pin = ["SmolLM2-135M-Instruct"]
    idle_timeout_s = 900

    [models."SmolLM2-135M-Instruct"]
    aliases = ["smol"]
    ttl_s = 3600

    [profiles."smol:coder"]
    temperature = 0.2
    system_prompt = "You write Python."

`render_toml` prints an effective configuration in this same format, each setting
labelled with where its value came from; read back as a config file it gives the same
configuration, so `mlxd config show > config.toml` captures a working setup.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from router.config import (
    RENAMED_SETTINGS,
    TABLES,
    RouterConfig,
    default_home,
    make_config,
    setting_fields,
    setting_hints,
    setting_value,
)
from router.config_values import (
    ConfigError,
    flag_name,
    quote_key,
    strict_value,
    unknown_key_message,
)

CONFIG_FILE_NAME = "config.toml"
API_KEY_ENV = "MLXD_API_KEY"  # the API key from the environment keeps it out of `ps` output
ADMIN_KEY_ENV = "MLXD_ADMIN_KEY"
SECRET_ENV = {"api_key": API_KEY_ENV, "admin_key": ADMIN_KEY_ENV}
SECRETS = ("api_key", "api_keys", "admin_key")  # never logged
DEFAULT = "default"  # the source of a setting nobody set


@dataclass(frozen=True)
class LoadedConfig:
    """The effective configuration, and where each top-level setting's value came from."""

    config: RouterConfig
    # setting -> DEFAULT, the config file's path, "--flag" or "$MLXD_API_KEY"
    sources: Mapping[str, str]
    # what the user should change, though it works: old names of renamed settings
    warnings: tuple[str, ...] = ()


def current_names(values: Mapping[str, Any], source: str | None, warnings: list[str]) -> dict[str, Any]:
    """`values` under the settings' current names. An old name (RENAMED_SETTINGS) still
    works for one release, so an upgrade never stops a service over a name; it adds a
    warning. Old and new name together are an error: which one was meant is unknowable.
    `source` is the config file's path, or None for flags."""
    spell = flag_name if source is None else str
    renamed: dict[str, Any] = {}
    for key, value in values.items():
        new = RENAMED_SETTINGS.get(key)
        if new is None:
            renamed[key] = value
            continue
        if new in values:
            raise ConfigError(key, f"is the old name of {spell(new)}; give only {spell(new)}",
                              source or flag_name(key))
        renamed[new] = value
        where = f"{source}: " if source else ""
        warnings.append(f"{where}{spell(key)} is now called {spell(new)}; the old name works until mlxd 0.2")
    return renamed


def default_config_path(home: Path) -> Path:
    """Where the config file is looked for when no --config is given."""
    return home / CONFIG_FILE_NAME


def read_config_file(path: Path, warnings: list[str] | None = None) -> dict[str, Any]:
    """The settings in the TOML file at `path`, type-checked (a TOML string is never taken
    for a number). Relative paths in it are relative to the file, not to wherever mlxd
    happens to be started. Any problem raises ConfigError naming the file and the key.
    """
    source = str(path)
    try:
        with open(path, "rb") as file:
            raw = tomllib.load(file)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(None, f"not valid TOML: {exc}", source) from None
    except OSError as exc:
        raise ConfigError(None, f"cannot read it: {exc.strerror or exc}", source) from None
    raw = current_names(raw, source, [] if warnings is None else warnings)
    hints = setting_hints()
    file_keys = [*(name for name, f in setting_fields().items() if not f.metadata.get("cli_only")), *TABLES]
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key in hints and key not in file_keys:
            raise ConfigError(key, f"can only be given as {flag_name(key)} on the command line", source)
        if key not in hints:
            raise ConfigError(key, unknown_key_message(key, file_keys), source)
        if key in TABLES:
            values[key] = value  # RouterConfig checks each entry and names it on error
            continue
        try:
            value = strict_value(key, value, hints[key])
        except ConfigError as exc:
            raise exc.at(source) from None
        if isinstance(value, Path):
            value = path.parent / value.expanduser()
        values[key] = value
    return values


def _config_path(flags: Mapping[str, Any]) -> Path | None:
    """The file to read: --config (which must exist), else HOME/config.toml if it exists."""
    explicit = flags.get("config")
    if explicit is not None:
        path = Path(explicit).expanduser()
        if not path.exists():
            raise ConfigError("config", f"no such file: {explicit}", flag_name("config"))
        return path
    home = Path(flags["home"]).expanduser() if flags.get("home") is not None else default_home()
    path = default_config_path(home)
    return path if path.exists() else None


def load_config(flags: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> LoadedConfig:
    """The effective configuration: defaults < config file < $MLXD_API_KEY < `flags`.

    `flags` holds only the flags actually given (values as from argparse). A bad value
    raises ConfigError whose `source` is where it was set, so the message sends the user
    to the file or to the flag.
    """
    environ = os.environ if environ is None else environ
    path = _config_path(flags)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    warnings: list[str] = []
    if path is not None:
        for key, value in read_config_file(path, warnings).items():
            values[key], sources[key] = value, str(path)
    for key, variable in SECRET_ENV.items():
        if environ.get(variable):
            values[key], sources[key] = environ[variable], f"${variable}"
    for key, value in current_names(flags, None, warnings).items():
        if key != "config":
            values[key], sources[key] = value, flag_name(key)
    values["config"] = path
    if flags.get("config") is not None:
        sources["config"] = flag_name("config")
    try:
        config = make_config(values)
    except ConfigError as exc:
        top = exc.key.split(".")[0] if exc.key else None
        raise exc.at(sources.get(top) if top else None) from None
    return LoadedConfig(config, {name: sources.get(name, DEFAULT) for name in [*setting_fields(), *TABLES]},
                        tuple(warnings))


def toml_value(value: Any) -> str:
    """A setting's value as TOML (bool, int, float, str, Path, or a list of str)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (str, Path)):
        return quote_key(str(value))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, Mapping):  # an inline table keeps the order (model_aliases: first match wins)
        return "{" + ", ".join(f"{quote_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML form for {value!r}")


def render_toml(loaded: LoadedConfig) -> str:
    """The effective configuration as a config file: every top-level setting with a comment
    naming its source, then one table per model and per profile.

    Unset settings and the keys from $MLXD_API_KEY / $MLXD_ADMIN_KEY are printed as comments
    (TOML has no null, and a secret kept out of the file should stay out of its copies), so
    reading the output back gives the same configuration.
    """
    config, sources = loaded.config, loaded.sources
    read = f"read from {config.config}" if config.config is not None else "no config file read"
    lines = [f"# mlxd effective configuration ({read}); each comment says where a value came from"]
    for f in setting_fields().values():
        if f.metadata.get("cli_only"):
            continue
        value, source = setting_value(config, f.name), sources[f.name]
        if value is None:
            lines.append(f"# {f.name} is not set  # {source}")
        elif source.startswith("$"):
            lines.append(f"# {f.name} is set, not shown  # {source}")
        else:
            lines.append(f"{f.name} = {toml_value(value)}  # {source}")
    for table in TABLES:
        for name, entry in getattr(config, table).items():
            lines += ["", f"[{table}.{quote_key(name)}]"]
            for key, value in dataclasses.asdict(entry).items():
                if value is not None:
                    lines.append(f"{key} = {toml_value(value)}")
    return "\n".join(lines) + "\n"
