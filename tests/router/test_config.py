"""router.config: defaults are safe, bad values name their key, strings convert like flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from router.config import ConfigError, RouterConfig, make_config
from router.config_checks import is_loopback


def test_defaults() -> None:
    config = make_config()
    assert (config.host, config.port, config.api_key) == ("127.0.0.1", 8000, None)
    assert (config.heartbeat_s, config.ping_timeout_s, config.load_timeout_s) == (2.0, 60.0, 600.0)
    assert (config.worker.max_num_seqs, config.worker.prefill_chunk_tokens, config.sse_keepalive_s) == (8, 512, 10.0)
    assert config.models_dir == config.home / "models"


def test_home_follows_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MLXD_HOME", str(tmp_path))
    assert make_config().home == tmp_path
    assert make_config({"model_dir": "/x"}).models_dir == Path("/x")


def test_config_is_frozen() -> None:
    with pytest.raises(AttributeError):
        make_config().port = 1  # type: ignore[misc]


@pytest.mark.parametrize("overrides, expected", [
    ({"port": "8123"}, {"port": 8123}),
    ({"ping_timeout_s": "5", "heartbeat_s": 1}, {"ping_timeout_s": 5.0, "heartbeat_s": 1.0}),
    ({"home": "/tmp/h"}, {"home": Path("/tmp/h")}),
    ({"host": "0.0.0.0", "api_key": "k"}, {"host": "0.0.0.0", "api_key": "k"}),
    ({"host": "::1"}, {"host": "::1"}),
    ({"log_level": "debug"}, {"log_level": "debug"}),
])
def test_overrides_convert(overrides: dict[str, Any], expected: dict[str, Any]) -> None:
    config = make_config(overrides)
    assert {k: getattr(config, k) for k in expected} == expected


@pytest.mark.parametrize("overrides, key", [
    ({"port": 0}, "port"),
    ({"port": 70000}, "port"),
    ({"port": "http"}, "port"),
    ({"port": 80.5}, "port"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"heartbeat_s": -1}, "heartbeat_s"),
    ({"ping_timeout_s": 1, "heartbeat_s": 2}, "ping_timeout_s"),
    ({"sse_keepalive_s": 0}, "sse_keepalive_s"),
    ({"log_level": "loud"}, "log_level"),
    ({"dtype": "int3"}, "dtype"),
    ({"prompt_layout": "tools_last"}, "prompt_layout"),
    ({"max_context_tokens": -5}, "max_context_tokens"),
    ({"host": "0.0.0.0"}, "api_key"),
    ({"host": "192.168.1.4"}, "api_key"),
    ({"api_key": "  "}, "api_key"),
    ({"no_such_setting": 1}, "no_such_setting"),
])
def test_bad_values_name_the_key(overrides: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        make_config(overrides)
    assert err.value.key == key


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("localhost", True), ("::1", True), ("127.0.0.2", True),
    ("0.0.0.0", False), ("::", False), ("10.0.0.1", False), ("example.com", False),
])
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_every_setting_has_a_why() -> None:
    import dataclasses
    for f in dataclasses.fields(RouterConfig):
        assert f.metadata.get("help"), f.name
