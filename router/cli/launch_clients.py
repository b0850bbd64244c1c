"""What `mlxd launch` sets for each agent: the environment and flags that point Claude Code,
Codex or OpenCode at the service, name a served model, tell the client that model's window
(so it compacts before mlxd must refuse a prompt) and switch off the client's traffic to
anywhere else. Pure data: no processes, no network (router/cli/launch.py runs them).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

# the npm package each client comes from, for the error when it is not installed
PACKAGES = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex", "opencode": "opencode-ai"}
CLIENTS = tuple(PACKAGES)
# Claude Code's model name when no --model is given: a `claude-*` name, so the service's
# `model_aliases` (by default `claude-*` -> the default model) decides which model serves it,
# and one Claude Code does not know, so it takes the window from CLAUDE_CODE_MAX_CONTEXT_TOKENS
# (for a name it knows it uses its own table and ignores the variable)
CLAUDE_ALIAS = "claude-mlxd"
# every model slot Claude Code picks a name for by itself (side calls, /model, subagents)
CLAUDE_MODEL_VARIABLES = ("ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL",
                          "ANTHROPIC_DEFAULT_SONNET_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL",
                          "ANTHROPIC_DEFAULT_FABLE_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL")
# variables that would send Claude Code elsewhere or conflict with the token set here
CLAUDE_UNSET = ("ANTHROPIC_API_KEY", "CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX", "CLAUDE_CODE_USE_FOUNDRY")
KEY_VARIABLE = "MLXD_API_KEY"  # where Codex and OpenCode read the key from (named in their config, not its value)
PLACEHOLDER_KEY = "mlxd"  # the service has no key; Claude Code will not start without one
PROVIDER = "mlxd"  # the provider id in Codex's and OpenCode's configuration


@dataclass(frozen=True)
class Target:
    """The service and the model a client is pointed at."""

    base_url: str  # the service's root, no /v1
    model: str  # the name the client asks for: a model id, profile or alias
    served_by: str  # the model id that answers it
    key: str | None  # the API key, None for a service without one
    context_length: int | None  # the window requests under `model` get; None: not known before a load
    max_output_tokens: int | None  # the most tokens one answer may have


@dataclass(frozen=True)
class Setting:
    """One thing set for the client, as the user is shown it."""

    name: str  # a variable, or a flag as typed
    value: str | None  # None: the variable is removed from the client's environment
    why: str
    secret: bool = False

    def shown(self) -> str:
        if self.value is None:
            return f"unset {self.name}  # {self.why}"
        value = mask(self.value) if self.secret else self.value
        if not self.name.startswith("-"):
            return f"{self.name}={value}  # {self.why}"
        return f"{self.name} {value}  # {self.why}" if value else f"{self.name}  # {self.why}"


@dataclass
class Plan:
    """The client's command and environment changes, in the order they are shown."""

    client: str
    settings: list[Setting] = field(default_factory=list)
    args: list[str] = field(default_factory=list)  # before the user's arguments

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """`base` (the caller's environment) with this plan's variables set and removed."""
        env = dict(base)
        for setting in self.settings:
            if setting.name.startswith("-"):
                continue
            if setting.value is None:
                env.pop(setting.name, None)
            else:
                env[setting.name] = setting.value
        return env

    def variable(self, name: str, value: str | None, why: str, secret: bool = False) -> None:
        self.settings.append(Setting(name, value, why, secret))

    def flag(self, flag: str, why: str) -> None:
        """A bare switch: shown as one line, passed as one argument."""
        self.settings.append(Setting(flag, "", why))
        self.args.append(flag)

    def config_flag(self, flag: str, value: str, why: str) -> None:
        """A `-c key=value` style flag: shown as one line, passed as two arguments."""
        self.settings.append(Setting(flag, value, why))
        self.args += [flag, value]


def mask(secret: str) -> str:
    """Enough of a key to tell which one it is, not enough to use it."""
    return f"{secret[:3]}...({len(secret)} chars)" if len(secret) > 8 else "****"


def claude_plan(target: Target, environ: dict[str, str]) -> Plan:
    plan = Plan("claude")
    plan.variable("ANTHROPIC_BASE_URL", target.base_url, "the service (Anthropic Messages at /v1/messages)")
    plan.variable("ANTHROPIC_AUTH_TOKEN", target.key or PLACEHOLDER_KEY,
                  "the service's API key" if target.key else "any value: the service has no key",
                  secret=bool(target.key))
    for name in CLAUDE_UNSET:
        if name in environ:
            plan.variable(name, None, "would send Claude Code elsewhere or conflict with the token")
    for name in CLAUDE_MODEL_VARIABLES:
        plan.variable(name, target.model, f"every call on {target.served_by}" if name != "ANTHROPIC_MODEL" else
                      f"served by {target.served_by}")
    if target.context_length is not None:
        plan.variable("CLAUDE_CODE_MAX_CONTEXT_TOKENS", str(target.context_length),
                      "the model's window: Claude Code compacts before it (else it assumes 1M and never does)")
    if target.max_output_tokens is not None:
        plan.variable("CLAUDE_CODE_MAX_OUTPUT_TOKENS", str(target.max_output_tokens),
                      "the service's output cap: asks for no more, and keeps that much of the window free")
    plan.variable("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1",
                  "no telemetry, error reports, update checks: nothing goes anywhere but the service")
    plan.variable("CLAUDE_CODE_ATTRIBUTION_HEADER", "0",
                  "no per-request billing line in the system prompt (it changes every request and would end "
                  "the cached prefix there; mlxd strips it anyway)")
    plan.flag("--exclude-dynamic-system-prompt-sections",
              "the per-project parts of the system prompt (working directory, memory path, git status) go into "
              "the first user message, so a session in another project reuses the cached system prompt")
    return plan


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a TOML basic string: the same escapes as JSON's


def codex_plan(target: Target, environ: dict[str, str]) -> Plan:
    plan = Plan("codex")
    provider = {"name": _toml_string(PROVIDER), "base_url": _toml_string(f"{target.base_url}/v1"),
                "wire_api": _toml_string("responses")}
    if target.key:
        provider["env_key"] = _toml_string(KEY_VARIABLE)
        plan.variable(KEY_VARIABLE, target.key, "the service's API key (the provider's env_key)", secret=True)
    table = "{" + ", ".join(f"{key}={value}" for key, value in provider.items()) + "}"
    plan.config_flag("-c", f"model_providers.{PROVIDER}={table}", "the service, over the Responses API")
    plan.config_flag("-c", f"model_provider={_toml_string(PROVIDER)}", "use it")
    plan.config_flag("-c", f"model={_toml_string(target.model)}", f"served by {target.served_by}")
    if target.context_length is not None:
        plan.config_flag("-c", f"model_context_window={target.context_length}", "the model's window")
        plan.config_flag("-c", f"model_auto_compact_token_limit={auto_compact_limit(target)}",
                         "compact while a turn still fits the window")
    plan.config_flag("-c", "analytics.enabled=false", "no analytics (ab.chatgpt.com)")
    plan.config_flag("-c", "features.plugins=false", "no plugin sync (github.com, chatgpt.com)")
    plan.config_flag("-c", "check_for_update_on_startup=false", "no update check")
    return plan


def auto_compact_limit(target: Target) -> int:
    """Where Codex compacts: 90% of the window, and never later than leaves one answer's room."""
    assert target.context_length is not None
    room = target.max_output_tokens or 0
    return max(1, min(target.context_length * 9 // 10, target.context_length - room))


def opencode_config(target: Target) -> dict:
    """OpenCode's configuration: an OpenAI-compatible provider for the service with the one
    model, its limits, and the sharing and update switches off."""
    model: dict = {"name": f"{target.model} (mlxd)", "tool_call": True}
    limit = {key: value for key, value in (("context", target.context_length),
                                           ("output", target.max_output_tokens)) if value is not None}
    if limit:
        limit.setdefault("output", 0)  # both are required once `limit` is given
        limit.setdefault("context", 0)
        model["limit"] = limit
    options = {"baseURL": f"{target.base_url}/v1",
               "apiKey": f"{{env:{KEY_VARIABLE}}}" if target.key else PLACEHOLDER_KEY}
    return {"$schema": "https://opencode.ai/config.json",
            "provider": {PROVIDER: {"npm": "@ai-sdk/openai-compatible", "name": "mlxd", "options": options,
                                    "models": {target.model: model}}},
            "model": f"{PROVIDER}/{target.model}", "small_model": f"{PROVIDER}/{target.model}",
            "autoupdate": False, "share": "disabled"}


def opencode_plan(target: Target, environ: dict[str, str]) -> Plan:
    plan = Plan("opencode")
    if target.key:
        plan.variable(KEY_VARIABLE, target.key, "the service's API key (the provider's apiKey reads it)", secret=True)
    plan.variable("OPENCODE_CONFIG_CONTENT", json.dumps(opencode_config(target), separators=(",", ":")),
                  f"provider {PROVIDER} (@ai-sdk/openai-compatible) with {target.model} and its limit.context/"
                  "limit.output, the model and small_model on it, autoupdate off, share disabled; merged over "
                  "your own config")
    plan.variable("OPENCODE_DISABLE_MODELS_FETCH", "1", "no model list from models.dev")
    plan.variable("OPENCODE_DISABLE_AUTOUPDATE", "1", "no update check")
    plan.variable("OPENCODE_DISABLE_SHARE", "1", "no session sharing")
    plan.variable("OPENCODE_DISABLE_LSP_DOWNLOAD", "1", "no language-server downloads")
    return plan


PLANNERS: dict[str, Callable[[Target, dict[str, str]], Plan]] = {
    "claude": claude_plan, "codex": codex_plan, "opencode": opencode_plan}


def make_plan(client: str, target: Target, environ: dict[str, str]) -> Plan:
    """What to set for `client` to reach `target`; `environ` is the caller's environment."""
    return PLANNERS[client](target, environ)
