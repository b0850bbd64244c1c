"""Settings as flags: every `RouterConfig` setting becomes a flag of the same name with its
one line of why as help, and a subcommand reads the settings it was given before it runs.

What is a setting is the config's to say (`setting_fields`), so a subcommand's own
arguments (`--json`, `--timeout`, NAME) are never taken for one, and need no list here.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any

from router.config import RENAMED_SETTINGS, RouterConfig, setting_fields, setting_types
from router.config_file import LoadedConfig, load_config
from router.config_values import ConfigError, flag_name

# the settings that find this home's service, and those that also let a client in
HOME_SETTINGS = ("config", "home")
SERVICE_ADDRESS = (*HOME_SETTINGS, "host", "port")
CLIENT_SETTINGS = (*SERVICE_ADDRESS, "api_key", "api_key_file", "admin_key")

# what a subcommand runs once its arguments are parsed: the settings, and the arguments
Handler = Callable[[LoadedConfig, argparse.Namespace], int]


def _metavar(key: str, kind: type) -> str:
    if kind is int:
        return "N"
    if kind is float:
        return "SECONDS" if key.endswith("_s") else "X"
    return {"api_key": "KEY", "admin_key": "KEY", "api_key_file": "PATH", "api_keys": "NAME=KEY", "log_dir": "DIR",
            "home": "DIR", "model_dir": "DIR", "model": "MODEL", "config": "PATH",
            "pin": "NAME", "kvstore_dir": "DIR", "allowed_hosts": "NAME",
            "cors_origins": "ORIGIN", "model_aliases": "PATTERN=MODEL"}.get(key, key.upper())


def add_setting_flags(parser: argparse.ArgumentParser, only: Sequence[str] | None = None) -> None:
    """A flag for each setting (or for those in `only`, in that order); a flag not given is
    absent from the parsed arguments, so it overrides nothing."""
    types = setting_types()
    fields = setting_fields()
    # Tables (per-model settings) live in the config file only: they are not in `fields`.
    for f in fields.values() if only is None else [fields[key] for key in only]:
        kind = types[f.name]
        help_text = f.metadata["help"]
        if f.default not in (dataclasses.MISSING, None, ()):
            help_text += f" (default: {f.default})"
        if kind is bool:
            parser.add_argument(
                flag_name(f.name), dest=f.name, action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS, help=help_text,
            )
            continue
        parser.add_argument(
            flag_name(f.name),
            dest=f.name,
            type=kind if kind in (int, float) else str,
            choices=f.metadata.get("choices"),
            action="append" if f.metadata.get("repeatable") else "store",
            default=argparse.SUPPRESS,  # only flags given on the command line override
            metavar=None if f.metadata.get("choices") else _metavar(f.name, kind),
            help=help_text,
        )
    if only is not None:
        return
    for old, new in RENAMED_SETTINGS.items():  # old spellings, kept out of --help
        kind = types[new]
        parser.add_argument(flag_name(old), dest=old, default=argparse.SUPPRESS, help=argparse.SUPPRESS,
                            **({"action": argparse.BooleanOptionalAction} if kind is bool
                               else {"type": kind if kind in (int, float) else str}))


def given_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given on the command line (flags not given are absent, not defaulted)."""
    names = setting_fields().keys() | RENAMED_SETTINGS.keys()
    return {k: v for k, v in vars(args).items() if k in names}


def config_from_args(args: argparse.Namespace) -> RouterConfig:
    """Defaults < config file < $MLXD_API_KEY < CLI flags. Raises ConfigError."""
    return load_config(given_flags(args)).config


def describe_config_error(exc: ConfigError) -> str:
    """Where to fix a bad setting: `FILE: key: message`, `--flag: message` or `$ENV: message`."""
    source = exc.source or ""
    if source.startswith("$"):
        return f"{source}: {exc.message}"
    if source and not source.startswith("--"):
        return str(exc)  # a config file: its path, the key, the message
    return f"{flag_name(exc.key)}: {exc.message}" if exc.key else exc.message


def with_settings(command: str, handler: Handler) -> Callable[[argparse.Namespace], int]:
    """`handler`, run with the settings loaded from defaults < config file < $MLXD_API_KEY
    < the flags given; a bad setting is said (naming where to fix it) and exits 2 before it
    runs, and a renamed one is warned about."""
    def run(args: argparse.Namespace) -> int:
        try:
            loaded = load_config(given_flags(args))
        except ConfigError as exc:
            print(f"mlxd {command}: error: {describe_config_error(exc)}", file=sys.stderr)
            return 2
        for warning in loaded.warnings:
            print(f"mlxd {command}: warning: {warning}", file=sys.stderr)
        return handler(loaded, args)
    return run
