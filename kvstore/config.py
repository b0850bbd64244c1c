"""`python -m kvstore` flags: supervised (`--connect`, `--identity`: the router sends the
settings in the handshake), or standalone for tests and tools (`--bind`, `--root` and one
flag per `KVStoreSettings` field, generated from it so no setting is spelled twice)."""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from protocol.messages import PROTOCOL_VERSION, KVStoreConfig
from protocol.settings import KVStoreSettings, SettingError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(i?))?b?\s*$", re.IGNORECASE)


def parse_bytes(text: str, flag: str) -> int:
    """'10GiB', '64MiB', '500M', '1048576' -> bytes; an error names the flag."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"{flag}: {text!r} is not a size (examples: 1048576, 512MiB, 10GiB)")
    number, prefix, binary = match.groups()
    scale = (1024 if binary else 1000) ** ("kmgt".index(prefix.lower()) + 1) if prefix else 1
    return int(float(number) * scale)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kvstore", description="mlxd SSD cold tier of the prefix KV cache")
    supervised = parser.add_argument_group("supervised (the router starts it so)")
    supervised.add_argument("--connect", help="the router's ipc:// address; the settings come in the handshake")
    supervised.add_argument("--identity", help="this kvstore's socket identity (kvstore#N)")
    standalone = parser.add_argument_group("standalone (tests and tools)")
    standalone.add_argument("--bind", help="ipc:// (or tcp://) address of the ROUTER socket workers connect to")
    standalone.add_argument("--root", help="directory holding the store")
    standalone.add_argument("--namespace-cap", action="append", default=[], metavar="NS=BYTES",
                            help="cap on one namespace's bytes; repeatable")
    for f in dataclasses.fields(KVStoreSettings):
        standalone.add_argument(_flag(f.name), default=None, choices=f.metadata.get("choices"),
                                help=f"{f.metadata['help']} (default {f.default})")
    return parser


def _setting_value(f: dataclasses.Field[Any], text: str) -> Any:
    if f.name.endswith("_bytes"):
        return parse_bytes(text, _flag(f.name))
    if f.type in ("int", int):
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{_flag(f.name)}: {text!r} is not an integer") from None
    return text


def standalone_config(args: argparse.Namespace) -> KVStoreConfig:
    """The config a router would have sent, from standalone flags; ValueError names the flag."""
    if not args.bind or not args.root:
        raise ValueError("give --connect and --identity (supervised), or --bind and --root (standalone)")
    given = {f.name: _setting_value(f, getattr(args, f.name)) for f in dataclasses.fields(KVStoreSettings)
             if getattr(args, f.name) is not None}
    settings = KVStoreSettings(**given)
    try:
        settings.check()
    except SettingError as exc:
        raise ValueError(f"{_flag(exc.key)}: {exc.message}") from None
    caps: dict[str, int] = {}
    for item in args.namespace_cap:
        name, sep, size = item.rpartition("=")
        if not sep or not name:
            raise ValueError(f"--namespace-cap: expected NS=BYTES, got {item!r}")
        caps[name] = parse_bytes(size, "--namespace-cap")
    check_namespace_caps(caps)
    return KVStoreConfig(PROTOCOL_VERSION, root=args.root, bind=args.bind, settings=settings, namespace_caps=caps)


def check_namespace_caps(caps: dict[str, int]) -> None:
    for name, cap in caps.items():
        if cap <= 0:
            raise ValueError(f"--namespace-cap {name}: must be positive, got {cap}")


def make_config(argv: Sequence[str] | None = None) -> KVStoreConfig:
    """Parse standalone `python -m kvstore` flags; a bad value raises ValueError naming the flag."""
    return standalone_config(make_parser().parse_args(argv))
