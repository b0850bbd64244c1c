"""What a reload applies at once and what waits for a restart (router.reload.plan)."""

from __future__ import annotations

from router.config import make_config
from router.reload import plan


def test_live_settings_apply_and_held_ones_keep_their_running_value() -> None:
    running = make_config({"port": 8000, "idle_timeout_s": 0.0, "models": {"m": {"ttl_s": 60, "max_disk_bytes": 1 << 30}}})
    loaded = make_config({"port": 9000, "idle_timeout_s": 30.0, "pin": ["m"], "api_keys": {"ci": "sk-ci"},
                          "model_aliases": {"gpt-*": "m"},
                          "models": {"m": {"ttl_s": 5, "aliases": ["mini"], "max_disk_bytes": 2 << 30}}})
    config, report = plan(running, loaded)
    assert sorted(report.changed) == ["api_keys", "idle_timeout_s", "model_aliases", "models.m.aliases",
                                      "models.m.ttl_s", "pin"]
    assert sorted(report.restart_required) == ["models.m.max_disk_bytes", "port"]
    assert config.port == 8000 and config.idle_timeout_s == 30.0
    assert config.models["m"].ttl_s == 5 and config.models["m"].aliases == ("mini",)
    assert config.models["m"].max_disk_bytes == 1 << 30  # the kvstore holds the running cap
    assert config.ttl_for("m") == 5 and "m" in config.pinned and config.api_keys == {"ci": "sk-ci"}


def test_an_unchanged_file_changes_nothing() -> None:
    settings = {"pin": ["m"], "models": {"m": {"ttl_s": 5}}}
    config, report = plan(make_config(settings), make_config(settings))
    assert report.changed == [] and report.restart_required == [] and config == make_config(settings)


def test_a_config_file_made_after_the_start_is_read(tmp_path) -> None:
    """HOME/config.toml created while the service runs: the reload reads it and keeps it."""
    (tmp_path / "config.toml").write_text("idle_timeout_s = 60\n")
    config, report = plan(make_config({"home": tmp_path}), make_config({"home": tmp_path,
                                                                         "config": tmp_path / "config.toml",
                                                                         "idle_timeout_s": 60}))
    assert report.restart_required == [] and config.config == tmp_path / "config.toml"
    assert sorted(report.changed) == ["config", "idle_timeout_s"]
