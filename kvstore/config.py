"""The kvstore's settings: one frozen dataclass, built from its command line."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvstore.store import COMPRESSIONS

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(i?))?b?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class KVStoreConfig:
    bind: str  # ROUTER address any worker's DEALER connects to
    root: Path  # segments/, index.bin and namespaces.json live here
    max_disk_bytes: int = 10 << 30  # room for hundreds of long prefixes without filling a laptop SSD
    segment_bytes: int = 64 << 20  # big sequential files; compaction copies at most half of one
    compression: str = "lz4"  # fast enough to keep up with the disk; raw when it saves nothing
    namespace_caps: dict[str, int] = field(default_factory=dict)  # one model cannot crowd out the rest
    max_pending_bytes: int = 256 << 20  # write-behind queue; puts beyond it are dropped, not waited on


def parse_bytes(text: str, flag: str) -> int:
    """'10GiB', '64MiB', '500M', '1048576' -> bytes; an error names the flag."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"{flag}: {text!r} is not a size (examples: 1048576, 512MiB, 10GiB)")
    number, prefix, binary = match.groups()
    scale = (1024 if binary else 1000) ** ("kmgt".index(prefix.lower()) + 1) if prefix else 1
    return int(float(number) * scale)


def make_config(argv: Sequence[str] | None = None) -> KVStoreConfig:
    """Parse `python -m kvstore` flags; a bad value raises ValueError naming the flag."""
    parser = argparse.ArgumentParser(prog="python -m kvstore", description="mlxd SSD cold tier of the prefix KV cache")
    parser.add_argument("--bind", required=True, help="ipc:// (or tcp://) address of the ROUTER socket")
    parser.add_argument("--root", required=True, type=Path, help="directory holding the store")
    parser.add_argument("--max-disk-bytes", default="10GiB", help="cap on bytes under --root (default 10GiB)")
    parser.add_argument("--segment-bytes", default="64MiB", help="size of one segment file (default 64MiB)")
    parser.add_argument("--compression", default="lz4", choices=COMPRESSIONS)
    parser.add_argument("--namespace-cap", action="append", default=[], metavar="NS=BYTES",
                        help="cap on one namespace's bytes; repeatable")
    parser.add_argument("--max-pending-bytes", default="256MiB",
                        help="bytes of puts waiting for the disk before new ones are dropped (default 256MiB)")
    args = parser.parse_args(argv)
    caps: dict[str, int] = {}
    for item in args.namespace_cap:
        name, sep, size = item.rpartition("=")
        if not sep or not name:
            raise ValueError(f"--namespace-cap: expected NS=BYTES, got {item!r}")
        caps[name] = parse_bytes(size, "--namespace-cap")
    config = KVStoreConfig(
        bind=args.bind,
        root=args.root,
        max_disk_bytes=parse_bytes(args.max_disk_bytes, "--max-disk-bytes"),
        segment_bytes=parse_bytes(args.segment_bytes, "--segment-bytes"),
        compression=args.compression,
        namespace_caps=caps,
        max_pending_bytes=parse_bytes(args.max_pending_bytes, "--max-pending-bytes"),
    )
    validate(config)
    return config


def validate(config: KVStoreConfig) -> None:
    if config.segment_bytes < 4096:
        raise ValueError(f"--segment-bytes must be at least 4096, got {config.segment_bytes}")
    if config.max_disk_bytes < 2 * config.segment_bytes:
        raise ValueError(
            f"--max-disk-bytes ({config.max_disk_bytes}) must be at least twice --segment-bytes "
            f"({config.segment_bytes})"
        )
    if config.max_pending_bytes <= 0:
        raise ValueError("--max-pending-bytes must be positive")
    for name, cap in config.namespace_caps.items():
        if cap <= 0:
            raise ValueError(f"--namespace-cap {name}: must be positive, got {cap}")
