"""Where `mlxd launch` points its client: the service of this home, or one it starts in the
background (detached, as `mlxd serve` would, with the settings given to `launch`) and
waits for; it outlives the client, as a service started by hand would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from router.cli.service_file import find_service, service_url
from router.config import RouterConfig
from router.config_file import SECRET_ENV
from router.log_files import log_dir

POLL_S = 0.5
TIMEOUT_S = 10.0
STARTED_LOG = "launch-serve.log"  # the started service's stdout/stderr (what it says before its log files open)
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # where `router` is imported from


class LaunchError(Exception):
    """Why the client cannot be started; said on stderr, exit 1."""


def say(message: str) -> None:
    print(f"mlxd launch: {message}", file=sys.stderr, flush=True)


def get_json(url: str, key: str | None, timeout: float = TIMEOUT_S) -> tuple[int, Any]:
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
        status, health = get_json(f"{url}/health", None, timeout=5)
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
    status, _ = get_json(f"{url}/health", None, timeout=5)
    if status:
        return url
    return start_service(config, flags, model)
