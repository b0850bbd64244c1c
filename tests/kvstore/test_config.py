"""`python -m kvstore` standalone flags: generated from `KVStoreSettings` (same defaults),
sizes with units, errors that name the flag."""

from __future__ import annotations

import dataclasses

import pytest

from kvstore.config import make_config, make_parser, parse_bytes
from protocol.messages import PROTOCOL_VERSION, KVStoreConfig
from protocol.settings import KVStoreSettings

BASE = ["--bind", "ipc:///tmp/kv", "--root", "/tmp/store"]


def test_defaults_are_the_settings_defaults() -> None:
    assert make_config(BASE) == KVStoreConfig(PROTOCOL_VERSION, root="/tmp/store", bind="ipc:///tmp/kv",
                                              settings=KVStoreSettings())


def test_every_setting_is_a_flag_with_its_why() -> None:
    help_text = make_parser().format_help()
    for f in dataclasses.fields(KVStoreSettings):
        assert "--" + f.name.replace("_", "-") in help_text
        assert f.metadata["help"].split()[0] in help_text


@pytest.mark.parametrize(
    "text, value",
    [("1048576", 1 << 20), ("64MiB", 64 << 20), ("10GiB", 10 << 30), ("500M", 500_000_000), ("2kib", 2048),
     ("1.5G", 1_500_000_000), ("3 MB", 3_000_000)],
)
def test_sizes(text: str, value: int) -> None:
    assert parse_bytes(text, "--x") == value


def test_flags() -> None:
    config = make_config(BASE + ["--max-disk-bytes", "2MiB", "--segment-bytes", "256KiB", "--compression", "none",
                                 "--max-pending-bytes", "1MiB",
                                 "--namespace-cap", "a=1MiB", "--namespace-cap", "m@x=y=5"])
    assert config.settings == KVStoreSettings(max_disk_bytes=2 << 20, segment_bytes=256 << 10, compression="none",
                                              max_pending_bytes=1 << 20)
    assert config.namespace_caps == {"a": 1 << 20, "m@x=y": 5}


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--max-disk-bytes", "lots"], "--max-disk-bytes"),
        (["--max-disk-bytes", "1MiB"], "--max-disk-bytes"),  # less than two segments
        (["--segment-bytes", "100"], "--segment-bytes"),
        (["--max-pending-bytes", "0"], "--max-pending-bytes"),
        (["--namespace-cap", "nobytes"], "--namespace-cap"),
        (["--namespace-cap", "a=0"], "--namespace-cap"),
        ([], "--bind and --root"),
    ],
)
def test_bad_values_name_the_flag(extra: list[str], flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        make_config((BASE if extra else []) + extra)
