"""`mlxd launch claude|codex|opencode [-- ARGS]`: run an installed agent against this home's
service, starting the service first (detached, as `mlxd serve` would) if none runs, with
what router/launch_clients.py sets for that agent. Prints each setting on stderr, then
becomes the client (exec), so its exit code is the command's.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from router.api_keys import client_key, key_ring
from router.config import RouterConfig
from router.config_file import SECRET_ENV
from router.launch_clients import CLAUDE_ALIAS, PACKAGES, Plan, Target, make_plan
from router.log_files import log_dir
from router.service_file import find_service
from router.status_cli import service_url

POLL_S = 0.5
TIMEOUT_S = 10.0
STARTED_LOG = "launch-serve.log"  # the started service's stdout/stderr (what it says before its log files open)
PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # where `router` is imported from


class LaunchError(Exception):
    """Why the client cannot be started; said on stderr, exit 1."""


def say(message: str) -> None:
    print(f"mlxd launch: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the service


def _get(url: str, key: str | None, timeout: float = TIMEOUT_S) -> tuple[int, Any]:
    """(status, JSON body) of a GET; (0, None) when nothing answers."""
    request = urllib.request.Request(url)
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read())
        except ValueError:
            return exc.code, None
    except (OSError, ValueError):
        return 0, None


def serve_command(config: RouterConfig, flags: dict[str, Any], model: str | None) -> tuple[list[str], dict[str, str]]:
    """The detached `mlxd serve` for this home: the settings given to `launch` as flags
    (secrets through the environment, out of `ps`), and `model` (a profile's model) to serve."""
    command = [sys.executable, "-m", "router", "serve", "--home", str(config.home.resolve())]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), env.get("PYTHONPATH")]))
    for key, value in flags.items():
        if key == "home":
            continue
        if key in SECRET_ENV:
            env[SECRET_ENV[key]] = str(value)
            continue
        if isinstance(value, Path) or key in ("config", "model_dir", "log_dir", "api_key_file", "kvstore_dir"):
            value = str(Path(value).expanduser().resolve())
        flag = "--" + key.replace("_", "-")
        for item in value if isinstance(value, list) else [value]:
            command += [flag, str(item)] if not isinstance(item, bool) else [flag if item else f"--no-{flag[2:]}"]
    if model is not None:
        command += ["--model", model.split(":", 1)[0]]
    return command, env


def start_service(config: RouterConfig, flags: dict[str, Any], model: str | None) -> str:
    """Start `mlxd serve` for the home in the background and wait until it is ready;
    its URL. It outlives this command, as a service started by hand would."""
    command, env = serve_command(config, flags, model)
    logs = log_dir(config)
    logs.mkdir(parents=True, exist_ok=True, mode=0o700)
    out = logs / STARTED_LOG
    say(f"no service serves home {config.home}; starting one: {' '.join(command[1:])} (output in {out})")
    with open(out, "ab") as sink:
        os.chmod(out, 0o600)
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                                 env=env, start_new_session=True)
    deadline = time.monotonic() + config.load_timeout_s
    said = None
    while True:
        if child.poll() is not None:
            tail = out.read_text(errors="replace").splitlines()[-15:]
            raise LaunchError(f"the service exited with {child.returncode}:\n" + "\n".join(tail))
        running = find_service(config.home)
        url = running.url if running is not None else service_url(config)
        status, health = _get(f"{url}/health", None, timeout=5)
        state = (health or {}).get("status") if status else "not listening yet"
        if status == 200 and state == "ok":
            say(f"service ready on {url} (pid {child.pid}; it keeps running after the client exits: "
                f"stop it with `kill {child.pid}`)")
            return url
        if state != said:
            say(f"service {state}")
            said = state
        if time.monotonic() > deadline:
            raise LaunchError(f"the service is not ready after {config.load_timeout_s:.0f} s ({state}); "
                              f"see {out} and `mlxd logs`")
        time.sleep(POLL_S)


def find_or_start(config: RouterConfig, flags: dict[str, Any], model: str | None) -> str:
    """The URL of the home's service (or of whatever answers at the configured address)."""
    url = service_url(config)
    status, _ = _get(f"{url}/health", None, timeout=5)
    if status:
        return url
    return start_service(config, flags, model)


# --------------------------------------------------------------------------- the model


def model_card(url: str, name: str, key: str | None) -> dict[str, Any] | None:
    """`/v1/models/NAME` (a model, profile or alias), None when the service has no such name."""
    status, card = _get(f"{url}/v1/models/{urllib.parse.quote(name, safe='')}", key)
    if status == 404:
        return None
    if status != 200 or not isinstance(card, dict):
        raise LaunchError(f"{url}/v1/models/{name} answered {status or 'nothing'}: {card}")
    return card


def default_card(url: str, key: str | None) -> dict[str, Any]:
    """The service's default model (what `claude-*` names reach), else its first chat model."""
    status, listing = _get(f"{url}/v1/models", key)
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
            ids = [c.get("id") for c in (_get(f"{url}/v1/models", key)[1] or {}).get("data") or []]
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
