"""`mlxd launch claude|codex|opencode [-- ARGS]`: run an installed agent against this home's
service, starting the service first (detached, as `mlxd serve` would) if none runs, with
what router/cli/launch_clients.py sets for that agent. Prints each setting on stderr, then
becomes the client (exec), so its exit code is the command's.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from router.api_keys import client_key, key_ring
from router.cli.launch_clients import CLAUDE_ALIAS, CLIENTS, PACKAGES, Plan, Target, make_plan
from router.cli.launch_service import LaunchError, find_or_start, get_json, say
from router.cli.settings_flags import CLIENT_SETTINGS, add_setting_flags, given_flags, with_settings
from router.config import RouterConfig
from router.config_file import LoadedConfig


def add_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "launch",
        help="run Claude Code, Codex or OpenCode against this home's service (starting it if none runs)",
        description="Run the installed client against the service of this home (found as `mlxd status` finds "
                    "it; if none runs, `mlxd serve` is started in the background with these flags, and waited "
                    "for) with the base URL, a key, the model, the model's context window (so the client compacts "
                    "before the service must refuse a prompt) and the client's own traffic elsewhere switched "
                    "off. Prints each setting on stderr, then runs the client with ARGS; exits with its code.",
    )
    parser.add_argument("client", choices=CLIENTS, metavar="claude|codex|opencode", help="which client")
    parser.add_argument("client_args", nargs="*", metavar="-- ARGS",
                        help="arguments for the client, after `--` (e.g. -- -p \"Say hello.\")")
    parser.add_argument("--model", dest="launch_model", metavar="NAME", default=None,
                        help="the served model, profile or alias the client uses (default: the service's default "
                             "model; Claude Code then asks for claude-mlxd, which model_aliases sends there); a "
                             "service started by launch serves this model")
    parser.add_argument("--client-path", dest="client_path", metavar="PATH", default=None,
                        help="the client's executable (default: the first on PATH)")
    parser.add_argument("--print", "--dry-run", dest="print_only", action="store_true",
                        help="print the settings and the command on stdout instead of running the client")
    add_setting_flags(parser, only=(*CLIENT_SETTINGS, "model_dir", "log_dir"))
    parser.set_defaults(run=with_settings("launch", run))


def run(loaded: LoadedConfig, args: argparse.Namespace) -> int:
    return launch_command(loaded.config, given_flags(args), args.client, args.client_args, args.launch_model,
                          args.client_path, args.print_only)


# --------------------------------------------------------------------------- the model


def model_card(url: str, name: str, key: str | None) -> dict[str, Any] | None:
    """`/v1/models/NAME` (a model, profile or alias), None when the service has no such name."""
    status, card = get_json(f"{url}/v1/models/{urllib.parse.quote(name, safe='')}", key)
    if status == 404:
        return None
    if status != 200 or not isinstance(card, dict):
        raise LaunchError(f"{url}/v1/models/{name} answered {status or 'nothing'}: {card}")
    return card


def default_card(url: str, key: str | None) -> dict[str, Any]:
    """The service's default model (what `claude-*` names reach), else its first chat model."""
    status, listing = get_json(f"{url}/v1/models", key)
    if status != 200 or not isinstance(listing, dict):
        raise LaunchError(f"{url}/v1/models answered {status or 'nothing'}: {listing}")
    chat = [card for card in listing.get("data") or [] if card.get("kind", "chat") == "chat"]
    if not chat:
        raise LaunchError(f"the service at {url} serves no chat model")
    return next((card for card in chat if card.get("default")), chat[0])


def agent_key(config: RouterConfig) -> str | None:
    """The key the client sends: the first key that is not the admin key, else the admin key."""
    keys = key_ring(config).keys
    chosen = next((key for key in keys if not key.admin), keys[0] if keys else None)
    return chosen.secret if chosen is not None else None


def choose_target(client: str, url: str, requested: str | None, config: RouterConfig) -> Target:
    """Which name the client asks for and what the service says it gets under it."""
    key = client_key(config)
    if requested is not None:
        card = model_card(url, requested, key)
        if card is None:
            ids = [c.get("id") for c in (get_json(f"{url}/v1/models", key)[1] or {}).get("data") or []]
            raise LaunchError(f"the service has no model {requested!r} (it serves: {', '.join(map(str, ids))})")
        name = requested
    else:
        card = default_card(url, key)
        name = card["id"]
    alias = model_card(url, CLAUDE_ALIAS, key) if client == "claude" else None
    if alias is not None and _same_model(alias, card):  # Claude Code asks for a claude-* name where it can
        card, name = alias, CLAUDE_ALIAS
    if card.get("kind", "chat") != "chat":
        raise LaunchError(f"{name!r} is an {card.get('kind')} model; an agent needs a chat model")
    served_by = card.get("profile_of") or card.get("alias_of") or card["id"]
    return Target(base_url=url, model=name, served_by=served_by, key=agent_key(config),
                  context_length=card.get("context_length"), max_output_tokens=card.get("max_output_tokens"))


def _same_model(alias: dict[str, Any], card: dict[str, Any]) -> bool:
    """Whether an alias's card and a model's card name the same model under the same limits."""
    served = alias.get("profile_of") or alias.get("alias_of") or alias.get("id")
    return (served == (card.get("alias_of") or card.get("id")) and "profile_of" not in card
            and all(alias.get(k) == card.get(k) for k in ("context_length", "max_output_tokens")))


# --------------------------------------------------------------------------- the client


def find_client(client: str, client_path: str | None) -> str:
    if client_path is not None:
        path = Path(client_path).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise LaunchError(f"--client-path {client_path}: not an executable file")
        return str(path)
    found = shutil.which(client)
    if found is None:
        raise LaunchError(f"`{client}` is not on PATH; install it with `npm install -g {PACKAGES[client]}` "
                          "(or give its path with --client-path)")
    return found


def show(plan: Plan, target: Target, command: list[str]) -> list[str]:
    window = f"window {target.context_length}" if target.context_length is not None else "window not known"
    lines = [f"{plan.client} -> {target.base_url}, model {target.model} (served by {target.served_by}, {window}, "
             f"output cap {target.max_output_tokens})"]
    lines += [f"  {setting.shown()}" for setting in plan.settings]
    lines.append("  run: " + shlex.join(command))
    return lines


def launch_command(config: RouterConfig, flags: dict[str, Any], client: str, client_args: Sequence[str],
                   requested: str | None = None, client_path: str | None = None, print_only: bool = False) -> int:
    args = list(client_args)
    try:
        binary = find_client(client, client_path) if not print_only else (client_path or client)
        url = find_or_start(config, flags, requested)
        target = choose_target(client, url, requested, config)
    except LaunchError as exc:
        say(f"error: {exc}")
        return 1
    if target.context_length is None:
        say(f"warning: the window of {target.served_by} is not known until it is loaded once; "
            f"{client} is not told it")
    plan = make_plan(client, target, dict(os.environ))
    command = [binary, *plan.args, *args]
    for line in show(plan, target, command):
        print(line if print_only else f"mlxd launch: {line}", file=sys.stdout if print_only else sys.stderr,
              flush=True)
    if print_only:
        return 0
    try:
        os.execve(binary, command, plan.env(dict(os.environ)))
    except OSError as exc:
        say(f"error: cannot run {binary}: {exc.strerror or exc}")
        return 1
    return 0  # not reached: execve replaced this process
