"""`python -m kvstore` flags: defaults, sizes with units, errors that name the flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstore.config import KVStoreConfig, make_config, parse_bytes

BASE = ["--bind", "ipc:///tmp/kv", "--root", "/tmp/store"]


def test_defaults() -> None:
    assert make_config(BASE) == KVStoreConfig(bind="ipc:///tmp/kv", root=Path("/tmp/store"))
    assert KVStoreConfig("a", Path("b")).max_disk_bytes == 10 << 30


@pytest.mark.parametrize(
    "text, value",
    [("1048576", 1 << 20), ("64MiB", 64 << 20), ("10GiB", 10 << 30), ("500M", 500_000_000), ("2kib", 2048),
     ("1.5G", 1_500_000_000), ("3 MB", 3_000_000)],
)
def test_sizes(text: str, value: int) -> None:
    assert parse_bytes(text, "--x") == value


def test_flags() -> None:
    config = make_config(BASE + ["--max-disk-bytes", "2MiB", "--segment-bytes", "256KiB", "--compression", "none",
                                 "--namespace-cap", "a=1MiB", "--namespace-cap", "m@x=y=5"])
    assert (config.max_disk_bytes, config.segment_bytes, config.compression) == (2 << 20, 256 << 10, "none")
    assert config.namespace_caps == {"a": 1 << 20, "m@x=y": 5}


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--max-disk-bytes", "lots"], "--max-disk-bytes"),
        (["--max-disk-bytes", "1MiB"], "--max-disk-bytes"),  # less than two segments
        (["--segment-bytes", "100"], "--segment-bytes"),
        (["--namespace-cap", "nobytes"], "--namespace-cap"),
        (["--namespace-cap", "a=0"], "--namespace-cap"),
    ],
)
def test_bad_values_name_the_flag(extra: list[str], flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        make_config(BASE + extra)
