"""`mlxd wait`: block until the service answers ready, for scripts (`mlxd service start
--wait && run-agent`), printing what it waits for as the state changes.

Ready is what `/health` says: 200 once the start has loaded the pinned and command-line
models. Until the port opens there is nothing to ask, so a refused connection is waited
out too, up to the timeout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request

from router.cli.service_file import service_url
from router.cli.settings_flags import SERVICE_ADDRESS, add_setting_flags, with_settings
from router.config import RouterConfig
from router.config_file import LoadedConfig

POLL_S = 0.5


def add_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "wait",
        help="wait until the service is ready (for scripts)",
        description="Poll the service of this home (or --host/--port) until /health says ok: the port is "
                    "open and the pinned and command-line models are loaded. Prints 'mlxd ready on URL' and "
                    "exits 0, or exits 1 after --timeout.",
    )
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                        help="give up after this long (default 600)")
    add_setting_flags(parser, only=SERVICE_ADDRESS)
    parser.set_defaults(run=with_settings("wait", run))


def run(loaded: LoadedConfig, args: argparse.Namespace) -> int:
    return wait_command(loaded.config, args.timeout)


def _state(url: str) -> tuple[bool, str]:
    """(ready, what a person reads) from one /health answer."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            health = json.loads(response.read())
    except urllib.error.HTTPError as exc:  # 503: starting or degraded, with the same body
        try:
            health = json.loads(exc.read())
        except ValueError:
            return False, f"answered {exc.code}"
    except (OSError, ValueError):
        return False, "not listening yet"
    workers = ", ".join(f"{model} {worker.get('state')}" for model, worker in (health.get("workers") or {}).items())
    return health.get("status") == "ok", f"{health.get('status')}{': ' + workers if workers else ''}"


def wait_command(config: RouterConfig, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    started = time.monotonic()
    said = None
    while True:
        url = service_url(config)  # found through the home once the service has written it
        ready, state = _state(url)
        if ready:
            print(f"mlxd ready on {url} ({time.monotonic() - started:.1f} s)", flush=True)
            return 0
        if state != said:
            print(f"mlxd wait: {url} {state}", file=sys.stderr, flush=True)
            said = state
        if time.monotonic() > deadline:
            print(f"mlxd wait: not ready after {timeout_s:.0f} s ({state})", file=sys.stderr)
            return 1
        time.sleep(POLL_S)
