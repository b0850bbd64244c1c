"""router.model_aliases and the `model_aliases` setting: glob patterns from the config file
and flags, in order, checked at load; the pool's resolve tries them only after every exact
name, and an unmatched name is still a 404."""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path

import pytest

from protocol.errors import RequestError
from router.cli.mlxd import build_parser
from router.cli.settings_flags import config_from_args
from router.config import ConfigError, make_config
from router.config_file import load_config, render_toml
from router.model_aliases import DEFAULT_TARGET, match_alias
from router.children.pool import WorkerPool
from tests.router.router_harness import FAKE_WORKER, MODEL_ID


@pytest.mark.parametrize(("name", "expected"), [
    ("claude-haiku-4-5-20251001", ("claude-*-4-5-*", "small")),
    ("claude-opus-5-5", ("claude-*", "big")),
    ("Claude-opus-5-5", None),  # case-sensitive, the same on every platform
    ("gpt-4o", None),
    ("claude", None),
])
def test_first_matching_pattern_wins(name: str, expected: tuple[str, str] | None) -> None:
    patterns = {"claude-*-4-5-*": "small", "claude-*": "big", "claude-*-5-5": "never reached"}
    assert match_alias(patterns, name) == expected


def test_default_sends_claude_names_to_the_default_model() -> None:
    assert dict(make_config().model_aliases) == {"claude-*": DEFAULT_TARGET}


def test_config_file_table_keeps_its_order(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[model_aliases]\n"claude-*-haiku-*" = "smol"\n"claude-*" = "<default>"\n"gpt-*" = "smol"\n')
    config = load_config({"config": str(path), "home": str(tmp_path)}).config
    assert list(config.model_aliases.items()) == [
        ("claude-*-haiku-*", "smol"), ("claude-*", DEFAULT_TARGET), ("gpt-*", "smol")]


def test_repeated_flags_give_pattern_model_pairs(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        ["serve", "--home", str(tmp_path), "--model-aliases", "claude-*-haiku-*=smol",
         "--model-aliases", "claude-*=big"])
    config = config_from_args(args)
    assert list(config.model_aliases.items()) == [("claude-*-haiku-*", "smol"), ("claude-*", "big")]


def test_config_show_reads_back_as_the_same_aliases(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('model_aliases = {"claude-*-haiku-*" = "smol", "claude-*" = "<default>"}\n')
    loaded = load_config({"config": str(path), "home": str(tmp_path)})
    shown = tomllib.loads(render_toml(loaded))
    assert list(shown["model_aliases"].items()) == list(loaded.config.model_aliases.items())


@pytest.mark.parametrize(("value", "words"), [
    (["claude-*"], "expected KEY=VALUE"),
    ({"claude-*": 3}, "expected a table of strings"),
    ({"": "smol"}, "must not be empty"),
    ({"claude-*": "smol:nope"}, "names no profile"),
    ({"claude-*": ""}, "must not be empty"),
])
def test_bad_values_name_the_setting(value: object, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as caught:
        make_config({"model_aliases": value})
    assert caught.value.key.startswith("model_aliases")


def test_a_profile_is_a_valid_target() -> None:
    config = make_config({"model_aliases": {"claude-*": "smol:brief"},
                          "profiles": {"smol:brief": {"max_tokens": 8}}})
    assert config.model_aliases["claude-*"] == "smol:brief"


def _pool(tmp_path: Path, **overrides: object) -> WorkerPool:
    model_dir = tmp_path / MODEL_ID
    model_dir.mkdir(exist_ok=True)
    (model_dir / "config.json").write_text("{}")
    config = make_config({"home": tmp_path / "home", **overrides})
    return WorkerPool(config, {MODEL_ID: model_dir}, worker_command=FAKE_WORKER)


def test_pool_resolves_unknown_claude_names_to_the_first_model_and_logs_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pool = _pool(tmp_path)
    with caplog.at_level(logging.INFO, logger="router.model_aliases"):
        for _ in range(3):
            assert pool.resolve("claude-opus-5-5") == (MODEL_ID, None)
        assert pool.resolve("claude-haiku-4-5-20251001") == (MODEL_ID, None)
    lines = [r.getMessage() for r in caplog.records if r.name == "router.model_aliases"]
    assert len(lines) == 2 and "'claude-opus-5-5' is served by fake-model" in lines[0]


def test_pool_still_404s_names_no_pattern_matches(tmp_path: Path) -> None:
    pool = _pool(tmp_path)
    with pytest.raises(RequestError) as caught:
        pool.resolve("gpt-4o")
    assert caught.value.status == 404 and caught.value.code == "model_not_found"


def test_exact_names_win_over_patterns(tmp_path: Path) -> None:
    pool = _pool(tmp_path, model_aliases={"*": "nothing-like-it"},
                 models={MODEL_ID: {"aliases": ["claude-special"]}},
                 profiles={f"{MODEL_ID}:brief": {"max_tokens": 8}})
    assert pool.resolve(MODEL_ID) == (MODEL_ID, None)
    assert pool.resolve("claude-special") == (MODEL_ID, None)
    assert pool.resolve(f"{MODEL_ID}:brief")[1] is not None


def test_a_pattern_may_select_a_profile(tmp_path: Path) -> None:
    pool = _pool(tmp_path, model_aliases={"claude-*-haiku-*": f"{MODEL_ID}:brief"},
                 profiles={f"{MODEL_ID}:brief": {"max_tokens": 8}})
    model_id, profile = pool.resolve("claude-3-5-haiku-latest")
    assert model_id == MODEL_ID and profile is not None and profile.max_tokens == 8


def test_a_target_that_names_no_model_stops_the_start(tmp_path: Path) -> None:
    pool = _pool(tmp_path, model_aliases={"claude-*": "no-such-model"})
    with pytest.raises(RequestError, match="no-such-model"):
        pool.names.check_config(pool.config)
