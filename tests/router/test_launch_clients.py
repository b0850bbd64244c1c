"""What `mlxd launch` sets for each client (router/cli/launch_clients.py), without processes."""

from __future__ import annotations

import json

import pytest

from router.cli.launch_clients import (
    CLAUDE_ALIAS,
    CLAUDE_MODEL_VARIABLES,
    Target,
    auto_compact_limit,
    make_plan,
    mask,
    opencode_config,
)

URL = "http://127.0.0.1:8123"
KEY = "sk-local-0123456789"
OPEN = Target(URL, CLAUDE_ALIAS, "qwen2.5-coder-0.5b", None, 32768, 4096)
KEYED = Target(URL, "qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b", KEY, 32768, 4096)


def test_claude_reaches_the_service_on_served_models_with_the_window() -> None:
    plan = make_plan("claude", OPEN, {"ANTHROPIC_API_KEY": "sk-ant-real", "PATH": "/bin"})
    env = plan.env({"ANTHROPIC_API_KEY": "sk-ant-real", "PATH": "/bin"})
    assert env["ANTHROPIC_BASE_URL"] == URL and env["ANTHROPIC_AUTH_TOKEN"] == "mlxd"
    assert "ANTHROPIC_API_KEY" not in env and env["PATH"] == "/bin"  # a real key never goes with it
    assert all(env[name] == CLAUDE_ALIAS for name in CLAUDE_MODEL_VARIABLES)
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "32768" and env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "4096"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1" and env["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0"
    # per-project sections out of the system prompt: a session in another project starts warm
    assert plan.args == ["--exclude-dynamic-system-prompt-sections"]
    assert "--exclude-dynamic-system-prompt-sections  # " in "\n".join(s.shown() for s in plan.settings)
    assert "unset ANTHROPIC_API_KEY" in "\n".join(s.shown() for s in plan.settings)


def test_claude_without_a_known_window_is_not_told_one() -> None:
    unknown = Target(URL, "m", "m", KEY, None, 4096)
    env = make_plan("claude", unknown, {}).env({})
    assert "CLAUDE_CODE_MAX_CONTEXT_TOKENS" not in env and env["ANTHROPIC_AUTH_TOKEN"] == KEY


def test_codex_gets_a_responses_provider_the_model_and_its_window() -> None:
    plan = make_plan("codex", KEYED, {})
    pairs = dict(value.split("=", 1) for flag, value in zip(plan.args[::2], plan.args[1::2]) if flag == "-c")
    assert set(plan.args[::2]) == {"-c"}  # only global -c flags: they go before any subcommand (exec)
    assert pairs["model_providers.mlxd"] == (f'{{name="mlxd", base_url="{URL}/v1", wire_api="responses", '
                                             'env_key="MLXD_API_KEY"}')
    assert pairs["model_provider"] == '"mlxd"' and pairs["model"] == '"qwen2.5-coder-1.5b"'
    assert pairs["model_context_window"] == "32768" and pairs["model_auto_compact_token_limit"] == "28672"
    assert pairs["analytics.enabled"] == "false" and pairs["features.plugins"] == "false"
    assert pairs["check_for_update_on_startup"] == "false"
    assert plan.env({})["MLXD_API_KEY"] == KEY
    assert KEY not in " ".join(plan.args)  # the key goes in the environment, not on the command line


def test_codex_on_an_open_service_names_no_key() -> None:
    plan = make_plan("codex", OPEN, {})
    assert "env_key" not in " ".join(plan.args) and "MLXD_API_KEY" not in plan.env({})


@pytest.mark.parametrize(("window", "output", "limit"), [(32768, 4096, 28672), (8192, 512, 7372), (4096, 4096, 1)])
def test_codex_compacts_before_the_last_answer_no_longer_fits(window: int, output: int, limit: int) -> None:
    assert auto_compact_limit(Target(URL, "m", "m", None, window, output)) == limit


def test_opencode_config_names_the_provider_model_and_limits() -> None:
    plan = make_plan("opencode", KEYED, {})
    env = plan.env({})
    config = json.loads(env["OPENCODE_CONFIG_CONTENT"])
    assert config == opencode_config(KEYED)
    provider = config["provider"]["mlxd"]
    assert provider["npm"] == "@ai-sdk/openai-compatible" and provider["options"]["baseURL"] == f"{URL}/v1"
    assert provider["options"]["apiKey"] == "{env:MLXD_API_KEY}" and env["MLXD_API_KEY"] == KEY
    assert provider["models"]["qwen2.5-coder-1.5b"]["limit"] == {"context": 32768, "output": 4096}
    assert config["model"] == config["small_model"] == "mlxd/qwen2.5-coder-1.5b"
    assert config["autoupdate"] is False and config["share"] == "disabled"
    assert env["OPENCODE_DISABLE_MODELS_FETCH"] == "1" and env["OPENCODE_DISABLE_AUTOUPDATE"] == "1"
    assert plan.args == []
    assert KEY not in env["OPENCODE_CONFIG_CONTENT"]


def test_shown_lines_mask_keys() -> None:
    for client in ("claude", "codex", "opencode"):
        shown = "\n".join(s.shown() for s in make_plan(client, KEYED, {}).settings)
        assert KEY not in shown and mask(KEY) in shown
    assert mask("short") == "****"
