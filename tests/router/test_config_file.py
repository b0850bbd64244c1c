"""router.config_file: defaults < file < flags, every bad setting names its key and file,
`mlxd config show` labels sources and reads back as the same configuration."""

from __future__ import annotations

import dataclasses
import pickle
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from router import cli, config as config_module
from router.cli import serve
from router.cli.mlxd import build_parser
from router.cli.settings_flags import given_flags
from router.config import (
    TABLES,
    MEMORY_RESERVE_BYTES,
    MIN_MEMORY_BUDGET_BYTES,
    ConfigError,
    ModelSettings,
    RouterConfig,
    auto_memory_budget,
    make_config,
    setting_fields,
    setting_value,
)
from router.config_file import API_KEY_ENV, DEFAULT, LoadedConfig, load_config, render_toml
from router.profiles import Profile

GB = 1 << 30

RICH = """
port = 8080
idle_timeout_s = 900
pin = ["SmolLM2-135M-Instruct"]
log_level = "debug"
prefix_cache = false
model_dir = "models"

[models."SmolLM2-135M-Instruct"]
aliases = ["smol", "small"]
ttl_s = 3600
max_disk_bytes = 1073741824

[models."mlx-community/Qwen2.5-0.5B"]
pin = true

[profiles."smol:coder"]
temperature = 0.2
top_k = 40
stop = ["\\n\\n", "```"]
seed = 7
max_tokens = 256
context_limit = 4096
system_prompt = "You write \\"Python\\".\\nBe brief."

[profiles."mlx-community/Qwen2.5-0.5B:long"]
context_limit = 32768
"""


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh HOME with no config file, and no API key from the developer's shell."""
    path = tmp_path / "home"
    path.mkdir()
    monkeypatch.setenv("MLXD_HOME", str(path))
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    return path


def write(tmp_path: Path, text: str, name: str = "config.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def flags(*argv: str) -> dict[str, Any]:
    """What `mlxd serve ARGV` hands to load_config: the given flags, parsed by the real parser."""
    return given_flags(build_parser().parse_args(["serve", *argv]))


def load(*argv: str) -> LoadedConfig:
    return load_config(flags(*argv), environ={})


# ---------------------------------------------------------------- precedence


@pytest.mark.parametrize("key, file_line, argv, default, from_file, from_flag", [
    ("port", "port = 8080", ["--port", "9000"], 8000, 8080, 9000),
    ("max_num_seqs", "max_num_seqs = 4", ["--max-num-seqs", "2"], 8, 4, 2),
    ("idle_timeout_s", "idle_timeout_s = 90", ["--idle-timeout-s", "5.5"], 0.0, 90.0, 5.5),
    ("memory_budget_bytes", "memory_budget_bytes = 4294967296", ["--memory-budget-bytes", "1024"], 0, 4 * GB, 1024),
    ("log_level", 'log_level = "debug"', ["--log-level", "error"], "info", "debug", "error"),
    ("prefix_cache", "prefix_cache = false", ["--prefix-cache"], True, False, True),
    ("prompt_layout", 'prompt_layout = "template"', ["--prompt-layout", "stable_first"], "stable_first", "template",
     "stable_first"),
    ("pin", 'pin = ["a", "b"]', ["--pin", "c", "--pin", "d"], (), ("a", "b"), ("c", "d")),
    ("model", 'model = "Named"', ["--model", "Other"], None, "Named", "Other"),
])
def test_defaults_then_file_then_flags(tmp_path: Path, key: str, file_line: str, argv: list[str],
                                       default: Any, from_file: Any, from_flag: Any) -> None:
    path = write(tmp_path, file_line + "\n")
    assert setting_value(load().config, key) == default
    with_file = load("--config", str(path))
    assert setting_value(with_file.config, key) == from_file
    assert with_file.sources[key] == str(path)
    with_flag = load("--config", str(path), *argv)
    assert setting_value(with_flag.config, key) == from_flag
    assert with_flag.sources[key] == argv[0]


def test_default_file_in_home_is_read(home: Path) -> None:
    assert load().config.config is None  # no file: fine
    write(home, "port = 8081\n")
    loaded = load()
    assert (loaded.config.port, loaded.config.config) == (8081, home / "config.toml")


def test_home_flag_chooses_the_default_file(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    write(other, "port = 8082\n")
    assert load("--home", str(other)).config.port == 8082


def test_env_api_key_is_between_file_and_flags(tmp_path: Path) -> None:
    path = write(tmp_path, 'api_key = "from-file"\n')
    given = flags("--config", str(path))
    assert load_config(given, environ={}).config.api_key == "from-file"
    assert load_config(given, environ={API_KEY_ENV: "from-env"}).config.api_key == "from-env"
    given = flags("--config", str(path), "--api-key", "from-flag")
    assert load_config(given, environ={API_KEY_ENV: "from-env"}).config.api_key == "from-flag"


def test_relative_paths_in_the_file_are_relative_to_it(tmp_path: Path) -> None:
    path = write(tmp_path, 'model_dir = "models"\nkvstore_dir = "/abs/kv"\n')
    config = load("--config", str(path)).config
    assert (config.model_dir, config.kvstore_dir) == (tmp_path / "models", Path("/abs/kv"))


def test_tables_are_parsed(tmp_path: Path) -> None:
    config = load("--config", str(write(tmp_path, RICH))).config
    smol = config.models["SmolLM2-135M-Instruct"]
    assert smol == ModelSettings(aliases=("smol", "small"), ttl_s=3600.0, max_disk_bytes=GB)
    assert config.profiles["smol:coder"] == Profile(
        temperature=0.2, top_k=40, stop=("\n\n", "```"), seed=7, max_tokens=256, context_limit=4096,
        system_prompt='You write "Python".\nBe brief.')
    assert config.pinned == {"SmolLM2-135M-Instruct", "mlx-community/Qwen2.5-0.5B"}
    assert config.alias_targets == {"smol": "SmolLM2-135M-Instruct", "small": "SmolLM2-135M-Instruct"}
    assert (config.ttl_for("SmolLM2-135M-Instruct"), config.ttl_for("unlisted")) == (3600.0, 900.0)


# ---------------------------------------------------------------- errors name the key and the file


@pytest.mark.parametrize("text, key, message", [
    ("max_num_seq = 1", "max_num_seq", "did you mean 'max_num_seqs'?"),
    ("max-num-seqs = 1", "max-num-seqs", "did you mean 'max_num_seqs'? (keys use underscores)"),
    ("colour = 1", "colour", "unknown setting"),
    ('port = "8000"', "port", "expected an integer, got '8000'"),
    ("port = 80.5", "port", "expected an integer"),
    ('heartbeat_s = "fast"', "heartbeat_s", "expected a number"),
    ("prefix_cache = 1", "prefix_cache", "expected true or false"),
    ("home = 3", "home", "expected a path"),
    ("pin = [1]", "pin", "expected a list of strings"),
    ('pin = ["smol:coder"]', "pin", "':' starts a profile name"),
    ("max_num_seqs = 0", "max_num_seqs", "must be > 0, got 0"),
    ("port = 70000", "port", "must be between 1 and 65535"),
    ("idle_timeout_s = -1", "idle_timeout_s", "must be >= 0"),
    ("idle_timeout_s = inf", "idle_timeout_s", "must be a finite number"),
    ("memory_budget_bytes = -1", "memory_budget_bytes", "must be >= 0"),
    ('log_level = "loud"', "log_level", "must be one of critical, error"),
    ('compression = "zstd"', "compression", "must be one of lz4, none"),
    ("ping_timeout_s = 1.0", "ping_timeout_s", "must exceed heartbeat_s"),
    ('config = "other.toml"', "config", "only be given as --config"),
    ("models = 3", "models", "must be a table"),
    ('[models."smol"]\nttl = 5', 'models."smol".ttl', "did you mean 'ttl_s'?"),
    ('[models."smol"]\nttl_s = "long"', 'models."smol".ttl_s', "expected a number"),
    ('[models."smol"]\nttl_s = -5', 'models."smol".ttl_s', "must be >= 0"),
    ('[models."smol"]\nspeculation = "draft_model"', 'models."smol".speculation', "needs the model's draft_model"),
    ('[models."smol"]\ndraft_model = "smol"', 'models."smol".draft_model', "cannot draft for itself"),
    ('[models."smol"]\ndraft_model = "a:b"', 'models."smol".draft_model', "':' starts a profile name"),
    ('[models."smol"]\npin = "yes"', 'models."smol".pin', "expected true or false"),
    ('[models."smol"]\naliases = 3', 'models."smol".aliases', "expected a list of strings"),
    ('[models."smol"]\nmax_disk_bytes = 0', 'models."smol".max_disk_bytes', "must be > 0"),
    ('[models."smol"]\nmax_disk_bytes = 99999999999999', 'models."smol".max_disk_bytes', "<= max_disk_bytes"),
    ('[models."a:b"]', 'models."a:b"', "':' starts a profile name"),
    ('[models.a]\naliases = ["x"]\n[models.b]\naliases = ["x"]', 'models."b".aliases', "already names model 'a'"),
    ('[models.a]\n[models.b]\naliases = ["a"]', 'models."b".aliases', "already names model 'a'"),
    ('[profiles."smol:coder"]\ntemprature = 0.2', 'profiles."smol:coder".temprature', "did you mean 'temperature'?"),
    ('[profiles."smol:coder"]\ntemperature = 3', 'profiles."smol:coder".temperature', "must be >= 0.0 and <= 2.0"),
    ('[profiles."smol:coder"]\ntemperature = "hot"', 'profiles."smol:coder".temperature', "expected a number"),
    ('[profiles."smol:coder"]\ntop_k = 1.5', 'profiles."smol:coder".top_k', "expected an integer"),
    ('[profiles."smol:coder"]\ntop_p = 0', 'profiles."smol:coder".top_p', "must be > 0.0"),
    ('[profiles."smol:coder"]\nmax_tokens = 0', 'profiles."smol:coder".max_tokens', "must be >= 1"),
    ('[profiles."smol:coder"]\nstop = [1]', 'profiles."smol:coder".stop', "expected a list of strings"),
    ('[profiles."smol:coder"]\nsystem_prompt = 5', 'profiles."smol:coder".system_prompt', "expected a string"),
    ('[profiles."smol:coder"]\nreasoning_budget = -1', 'profiles."smol:coder".reasoning_budget', "must be >= 0"),
    ('[profiles."smol:coder"]\ncontext_limit = 100\nmax_tokens = 100', 'profiles."smol:coder".max_tokens',
     "less than context_limit (100)"),
    ('[profiles."smol:coder"]\ncontext_limit = 1', 'profiles."smol:coder".context_limit', "must be >= 2"),
    ('[profiles."smol:coder"]\nprompt_layout = "tools_last"', 'profiles."smol:coder".prompt_layout',
     "must be one of stable_first, template"),
    ('[profiles.smol]\ntemperature = 0.2', 'profiles."smol"', '"MODEL:PROFILE"'),
    ('[profiles."smol:a:b"]', 'profiles."smol:a:b"', '"MODEL:PROFILE"'),
    ('[profiles.":coder"]', 'profiles.":coder"', '"MODEL:PROFILE"'),
])
def test_bad_file_settings_name_key_and_file(tmp_path: Path, text: str, key: str, message: str) -> None:
    path = write(tmp_path, text + "\n")
    with pytest.raises(ConfigError) as err:
        load("--config", str(path))
    assert (err.value.key, err.value.source) == (key, str(path))
    assert message in err.value.message
    assert str(err.value).startswith(f"{path}: {key}: ")


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "port = \n")
    with pytest.raises(ConfigError) as err:
        load("--config", str(path))
    assert (err.value.key, err.value.source) == (None, str(path))
    assert "not valid TOML" in err.value.message and "line 1" in err.value.message


def test_explicit_config_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load("--config", str(tmp_path / "missing.toml"))
    assert (err.value.key, err.value.source) == ("config", "--config")
    assert "no such file" in err.value.message


def test_bad_flag_is_blamed_on_the_flag_not_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "max_num_seqs = 4\n")
    with pytest.raises(ConfigError) as err:
        load("--config", str(path), "--max-num-seqs", "0")
    assert (err.value.key, err.value.source) == ("max_num_seqs", "--max-num-seqs")


@pytest.mark.parametrize("argv, text, expected", [
    (["serve"], "max_num_seqs = 0", ["mlxd serve: error: ", "bad.toml: max_num_seqs: must be > 0, got 0"]),
    (["serve"], "max_num_seq = 1", ["bad.toml: max_num_seq: unknown setting; did you mean 'max_num_seqs'?"]),
    (["config", "show"], '[profiles."smol:coder"]\ntemprature = 1',
     ["mlxd config show: error: ", 'bad.toml: profiles."smol:coder".temprature:', "did you mean 'temperature'?"]),
    (["serve", "--max-num-seqs", "0"], "max_num_seqs = 4", ["mlxd serve: error: --max-num-seqs: must be > 0"]),
])
def test_cli_refuses_bad_config_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch, argv: list[str], text: str,
                                               expected: list[str]) -> None:
    monkeypatch.setattr(serve, "serve", lambda config, flags=None: pytest.fail("must not start serving"))
    path = write(tmp_path, text + "\n", "bad.toml")
    assert cli.main([*argv, "--config", str(path)]) == 2
    err = capsys.readouterr().err
    for fragment in expected:
        assert fragment in err, err


def test_cli_refuses_missing_explicit_config(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serve, "serve", lambda config, flags=None: pytest.fail("must not start serving"))
    assert cli.main(["serve", "--config", str(tmp_path / "nope.toml")]) == 2
    assert "error: --config: no such file" in capsys.readouterr().err


def test_cli_serves_with_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[RouterConfig] = []
    monkeypatch.setattr(serve, "serve", lambda config, flags=None: started.append(config) or 0)
    path = write(tmp_path, "port = 8123\nmax_queue = 3\n")
    assert cli.main(["serve", "--config", str(path), "--max-queue", "5"]) == 0
    assert (started[0].port, started[0].worker.max_queue, started[0].config) == (8123, 5, path)


# ---------------------------------------------------------------- config show


def _show(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(["config", "show", *argv]) == 0
    return capsys.readouterr().out


def _without_file(config: RouterConfig) -> RouterConfig:
    return dataclasses.replace(config, config=None)


def _values(shown: str) -> list[str]:
    """The printed settings without their source comments (and without the header)."""
    return [line.split("  # ")[0] for line in shown.splitlines()[1:]]


@pytest.mark.parametrize("text, argv", [
    ("", []),
    (RICH, []),
    (RICH, ["--port", "9000", "--pin", "a", "--no-cold-tier", "--home", "/tmp/elsewhere"]),
    ('[models."we\\"ird/na.me"]\naliases = ["é😀", "tab\\there"]\n'
     '[profiles."we\\"ird/na.me:p"]\nstop = "###"\n', ["--host", "0.0.0.0", "--api-key", "k"]),
])
def test_show_round_trips(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, argv: list[str]) -> None:
    path = write(tmp_path, text)
    shown = _show(["--config", str(path), *argv], capsys)
    tomllib.loads(shown)  # valid TOML
    again = write(tmp_path, shown, "shown.toml")
    original = load("--config", str(path), *argv).config
    reread = load("--config", str(again)).config
    assert _without_file(reread) == _without_file(original)
    assert reread.config == again
    assert _values(_show(["--config", str(again)], capsys)) == _values(shown)


def test_show_labels_each_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, RICH)
    lines = _show(["--config", str(path), "--port", "9000", "--no-cold-tier"], capsys).splitlines()
    for line in (f"# mlxd effective configuration (read from {path}); each comment says where a value came from",
                 "port = 9000  # --port",
                 "cold_tier = false  # --cold-tier",
                 f"idle_timeout_s = 900.0  # {path}",
                 f'pin = ["SmolLM2-135M-Instruct"]  # {path}',
                 f'model_dir = "{tmp_path / "models"}"  # {path}',
                 "max_queue = 64  # default",
                 '# api_key is not set  # default',
                 '[models."SmolLM2-135M-Instruct"]',
                 'aliases = ["smol", "small"]',
                 '[profiles."smol:coder"]',
                 'system_prompt = "You write \\"Python\\".\\nBe brief."'):
        assert line in lines, line
    top_level = lines[1:lines.index("")]
    assert all("  # " in line for line in top_level)
    assert len(top_level) == len(setting_fields()) - 1  # all but config (models, profiles: tables below)
    assert lines.index('[models."SmolLM2-135M-Instruct"]') < lines.index('[profiles."smol:coder"]')


def test_show_keeps_an_env_api_key_out(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_ENV, "sekrit")
    shown = _show(["--host", "0.0.0.0"], capsys)
    assert "sekrit" not in shown and f"# api_key is set, not shown  # ${API_KEY_ENV}" in shown
    again = write(tmp_path, shown, "shown.toml")
    assert load_config(flags("--config", str(again)), environ={API_KEY_ENV: "sekrit"}).config.api_key == "sekrit"


def test_sources_cover_every_setting(tmp_path: Path) -> None:
    loaded = load("--config", str(write(tmp_path, "port = 1234\n")), "--max-queue", "2")
    assert set(loaded.sources) == {*setting_fields(), *TABLES}
    assert (loaded.sources["port"], loaded.sources["max_queue"], loaded.sources["host"]) == (
        str(tmp_path / "config.toml"), "--max-queue", DEFAULT)
    assert loaded.sources["config"] == "--config"


def test_render_uses_the_sources(tmp_path: Path) -> None:
    loaded = LoadedConfig(make_config({"port": 1}), {name: DEFAULT for name in [*setting_fields(), *TABLES]})
    assert "port = 1  # default" in render_toml(loaded)


# ---------------------------------------------------------------- the new settings


@pytest.mark.parametrize("total, budget", [
    (64 * GB, 64 * GB - MEMORY_RESERVE_BYTES),
    (16 * GB, 8 * GB),
    (10 * GB, MIN_MEMORY_BUDGET_BYTES),
    (8 * GB, MIN_MEMORY_BUDGET_BYTES),
    (1 * GB, MIN_MEMORY_BUDGET_BYTES),
])
def test_auto_memory_budget(total: int, budget: int) -> None:
    assert auto_memory_budget(total) == budget


def test_effective_memory_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_module.psutil, "virtual_memory", lambda: SimpleNamespace(total=32 * GB))
    assert make_config().effective_memory_budget_bytes == 24 * GB
    assert make_config({"memory_budget_bytes": 5 * GB}).effective_memory_budget_bytes == 5 * GB


def test_config_with_tables_stays_a_value(tmp_path: Path) -> None:
    config = load("--config", str(write(tmp_path, RICH))).config
    assert hash(config) == hash(load("--config", str(tmp_path / "config.toml")).config)
    assert pickle.loads(pickle.dumps(config)) == config
    with pytest.raises(TypeError):
        config.models["x"] = ModelSettings()  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.profiles["smol:coder"].temperature = 1.0  # type: ignore[misc]


def test_tables_from_code_are_checked_like_the_file() -> None:
    config = RouterConfig(pin=["a"], models={"a": {"ttl_s": 5}}, profiles={"a:p": Profile(stop="x")})  # type: ignore[arg-type]
    assert (config.pin, config.models["a"].ttl_s, config.profiles["a:p"].stop) == (("a",), 5.0, ("x",))
    with pytest.raises(ConfigError) as err:
        RouterConfig(profiles={"a:p": {"top_p": 2}})  # type: ignore[dict-item]
    assert err.value.key == 'profiles."a:p".top_p'


def test_tables_have_no_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    out = capsys.readouterr().out
    assert "--pin NAME" in out and "--config PATH" in out and "--idle-timeout-s" in out
    assert "--models" not in out and "--profiles" not in out


# ---------------------------------------------------------------- renamed settings


def test_old_names_still_work_with_a_warning(tmp_path: Path) -> None:
    """cold_cache / cold_cache_dir / hot_cache_bytes (and their flags) were renamed; an
    upgraded service keeps its settings and is told the new names."""
    path = write(tmp_path, 'cold_cache = false\ncold_cache_dir = "kv"\nhot_cache_bytes = 1000\n')
    loaded = load("--config", str(path))
    assert (loaded.config.cold_tier, loaded.config.kvstore_dir, loaded.config.hot_tier_bytes) == (
        False, tmp_path / "kv", 1000)
    assert loaded.sources["kvstore_dir"] == str(path)
    assert len(loaded.warnings) == 3
    assert any("cold_cache_dir is now called kvstore_dir" in w for w in loaded.warnings), loaded.warnings
    by_flag = load("--no-cold-cache", "--cold-cache-dir", "/kv", "--hot-cache-bytes", "7")
    assert (by_flag.config.cold_tier, by_flag.config.kvstore_dir, by_flag.config.hot_tier_bytes) == (
        False, Path("/kv"), 7)
    assert by_flag.sources["hot_tier_bytes"] == "--hot-tier-bytes"
    assert any("--hot-cache-bytes is now called --hot-tier-bytes" in w for w in by_flag.warnings)
    assert load("--hot-tier-bytes", "7").warnings == ()


def test_old_and_new_name_together_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serve, "serve", lambda config, flags=None: pytest.fail("must not start serving"))
    path = write(tmp_path, "hot_cache_bytes = 1\nhot_tier_bytes = 2\n")
    assert cli.main(["serve", "--config", str(path)]) == 2
    assert "hot_cache_bytes: is the old name of hot_tier_bytes" in capsys.readouterr().err
    assert cli.main(["serve", "--cold-cache-dir", "/a", "--kvstore-dir", "/b"]) == 2
    assert "--cold-cache-dir: is the old name of --kvstore-dir" in capsys.readouterr().err


def test_the_cli_prints_the_rename_warning(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["config", "show", "--no-cold-cache"]) == 0
    captured = capsys.readouterr()
    assert "cold_tier = false  # --cold-tier" in captured.out
    assert "warning: --cold-cache is now called --cold-tier" in captured.err
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    assert "--cold-cache" not in capsys.readouterr().out  # the old flags stay out of --help


def test_output_caps_of_models_and_profiles(tmp_path: Path) -> None:
    text = ('[models.m]\nmax_output_tokens = 300\n[profiles."m:short"]\nmax_output_tokens = 50\n'
            '[profiles."m:long"]\nmax_output_tokens = 900\n')
    config = load("--config", str(write(tmp_path, text))).config
    assert config.output_cap_for("m", None) == 300
    assert config.output_cap_for("m", config.profiles["m:short"]) == 50
    assert config.output_cap_for("m", config.profiles["m:long"]) == 300  # a profile never loosens its model's
    assert config.output_cap_for("other", None) is None  # the worker's max_output_tokens applies
    for bad in ("[models.m]\nmax_output_tokens = 0\n", '[profiles."m:p"]\nmax_output_tokens = 0\n'):
        with pytest.raises(ConfigError, match="max_output_tokens: must be >= 1"):
            load("--config", str(write(tmp_path, bad)))
