"""`mlxd launch`'s choices against a real router with a fake worker: which name each client
asks for and what it is told, the serve command it would start, the errors it gives."""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.cli import launch, launch_service
from router.cli.launch_clients import CLAUDE_ALIAS
from router.cli.mlxd import main, split_client_args
from router.config import make_config
from router.config_file import API_KEY_ENV
from tests.router.router_harness import MODEL_ID, RunningRouter, start_router

pytestmark = pytest.mark.timeout(60)

OTHER = "other-model"  # a second chat model on disk, not loaded


@pytest.fixture
def router(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningRouter]:
    models = model_dir.parent / "home" / "models"
    (models / OTHER).mkdir(parents=True)
    (models / OTHER / "config.json").write_text(json.dumps({"max_position_embeddings": 32768}))
    profiles = {f"{OTHER}:small": {"context_limit": 6000}}
    yield from start_router(model_dir, monkeypatch, profiles=profiles)


def _config(router: RunningRouter) -> object:
    return make_config({"home": router.pool.config.home, "port": router.url.rsplit(":", 1)[1]})


def test_claude_asks_for_the_alias_when_it_reaches_the_model(router: RunningRouter) -> None:
    config = _config(router)
    target = launch.choose_target("claude", router.url, None, config)
    assert (target.model, target.served_by, target.context_length, target.max_output_tokens) == (
        CLAUDE_ALIAS, MODEL_ID, 2048, 4096)
    assert launch.choose_target("claude", router.url, MODEL_ID, config).model == CLAUDE_ALIAS
    # another model, or a profile, is asked for by its own name (the alias would not reach it)
    other = launch.choose_target("claude", router.url, OTHER, config)
    assert (other.model, other.served_by, other.context_length) == (OTHER, OTHER, 32768)
    small = launch.choose_target("claude", router.url, f"{OTHER}:small", config)
    assert (small.model, small.served_by, small.context_length) == (f"{OTHER}:small", OTHER, 6000)


def test_codex_and_opencode_ask_for_the_served_id(router: RunningRouter) -> None:
    config = _config(router)
    for client in ("codex", "opencode"):
        target = launch.choose_target(client, router.url, None, config)
        assert (target.model, target.served_by, target.key) == (MODEL_ID, MODEL_ID, None)


def test_unknown_and_non_chat_models_are_refused_by_name(router: RunningRouter) -> None:
    config = _config(router)
    with pytest.raises(launch.LaunchError, match=f"no model 'nope'.*{MODEL_ID}"):
        launch.choose_target("codex", router.url, "nope", config)
    with pytest.raises(launch.LaunchError, match="embedding model"):
        launch.choose_target("codex", router.url, "all-MiniLM-L6-v2", config)


def test_print_shows_everything_and_runs_nothing(router: RunningRouter, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    home, port = router.pool.config.home, router.url.rsplit(":", 1)[1]
    code = main(["launch", "codex", "--print", "--home", str(home), "--port", port, "--model", OTHER,
                 "--", "exec", "--skip-git-repo-check", "Say hello"])
    out = capsys.readouterr().out
    assert code == 0
    assert f"model {OTHER} (served by {OTHER}, window 32768, output cap 4096)" in out
    assert "-c=model_context_window=32768" not in out and "  -c model_context_window=32768  # " in out
    assert out.strip().splitlines()[-1].endswith("exec --skip-git-repo-check 'Say hello'")


def test_a_missing_client_names_its_npm_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(launch.LaunchError, match="npm install -g @anthropic-ai/claude-code"):
        launch.find_client("claude", None)
    with pytest.raises(launch.LaunchError, match="not an executable"):
        launch.find_client("codex", str(tmp_path / "codex"))
    fake = tmp_path / "opencode"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    assert launch.find_client("opencode", None) == str(fake)


def test_the_started_service_gets_launchs_settings_with_keys_out_of_ps(tmp_path: Path) -> None:
    config = make_config({"home": tmp_path / "home"})
    flags = {"home": str(tmp_path / "home"), "port": 9123, "api_key": "sk-secret-1234567",
             "model_dir": "models", "config": str(tmp_path / "c.toml")}
    command, env = launch_service.serve_command(config, flags, "qwen2.5-coder-0.5b:window")
    assert command[:4] == [sys.executable, "-m", "router", "serve"]
    assert command[4:] == ["--home", str((tmp_path / "home").resolve()), "--port", "9123",
                           "--model-dir", str(Path("models").resolve()), "--config", str(tmp_path / "c.toml"),
                           "--model", "qwen2.5-coder-0.5b"]
    assert "sk-secret-1234567" not in " ".join(command) and env[API_KEY_ENV] == "sk-secret-1234567"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(launch_service.PACKAGE_ROOT)
    assert (launch_service.PACKAGE_ROOT / "router" / "__main__.py").is_file()  # the started `-m router` is ours


def test_client_arguments_after_the_double_dash_are_the_clients() -> None:
    assert split_client_args(["launch", "claude", "--model", "m", "--", "-p", "hi", "--model", "x"]) == (
        ["launch", "claude", "--model", "m"], ["-p", "hi", "--model", "x"])
    assert split_client_args(["status", "--", "x"]) == (["status", "--", "x"], [])
