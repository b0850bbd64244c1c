"""`mlxd logs`: the last lines of the service's log files (router.log, kvstore.log,
worker-MODEL.log under log_dir) merged in time order, and with `-f` the new ones as they
come, also across a rotation. Reads the files only: no running service is needed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from router.cli.log_records import FileFollower, merge, tail
from router.cli.settings_flags import HOME_SETTINGS, add_setting_flags, with_settings
from router.config import RouterConfig
from router.config_file import LoadedConfig
from router.log_files import (
    KVSTORE_LOG,
    ROUTER_LOG,
    WORKER_LOG_PREFIX,
    log_dir,
    worker_log_name,
    worker_model,
)

ROLES = ("router", "worker", "kvstore")
FOLLOW_POLL_S = 0.2


def add_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "logs",
        help="print the service's log files (router, workers, kvstore), merged in time order",
        description="Print the last lines of the log files under the home's log directory (router.log, "
                    "kvstore.log, worker-MODEL.log), merged in time order; -f keeps printing new ones, also "
                    "across a rotation, until Ctrl-C. Reads the files: no running service is needed.",
    )
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    parser.add_argument("-n", "--lines", type=int, default=100, help="how many lines (default 100)")
    parser.add_argument("--role", dest="role", action="append", choices=ROLES,
                        help="only this process's file(s); repeat for more (default: all)")
    parser.add_argument("--model", dest="model_name", metavar="NAME",
                        help="only the worker of this model (its id, as /v1/models lists it)")
    add_setting_flags(parser, only=(*HOME_SETTINGS, "log_dir"))
    parser.set_defaults(run=with_settings("logs", run))


def run(loaded: LoadedConfig, args: argparse.Namespace) -> int:
    return logs_command(loaded.config, args.role, args.model_name, args.lines, args.follow)


def log_files(directory: Path, roles: Sequence[str], model: str | None) -> list[Path]:
    """The current log files of `roles` in `directory` (backups are found from them); with
    `model`, the worker file is that model's only. Files that do not exist are left out."""
    found: list[Path] = []
    if "router" in roles:
        found.append(directory / ROUTER_LOG)
    if "kvstore" in roles:
        found.append(directory / KVSTORE_LOG)
    if "worker" in roles:
        if model is not None:
            found.append(directory / worker_log_name(model))
        else:
            found += sorted(directory.glob(f"{WORKER_LOG_PREFIX}*.log"))
    return [path for path in found if path.is_file()]


def logged_models(directory: Path) -> list[str]:
    """The models with a worker log file in `directory`."""
    return sorted(name for path in directory.glob(f"{WORKER_LOG_PREFIX}*.log")
                  if (name := worker_model(path.name)) is not None)


def follow(directory: Path, roles: Sequence[str], model: str | None, followers: dict[Path, FileFollower],
           poll_s: float = FOLLOW_POLL_S) -> None:
    """Print new records of the chosen files as they are written, each poll's merged in time
    order, until interrupted; files that appear later (a model loaded since) are read from
    their start and join `followers`."""
    while True:
        for path in log_files(directory, roles, model):
            if path not in followers:
                followers[path] = FileFollower(path)
        batch = merge([follower.read_records() for follower in followers.values()], sys.maxsize)
        for entry in batch:
            sys.stdout.write(entry.text + "\n")
        if batch:
            sys.stdout.flush()
        time.sleep(poll_s)


def logs_command(config: RouterConfig, roles: Sequence[str] | None, model: str | None, num_lines: int,
                 keep_following: bool) -> int:
    """`mlxd logs`: the last `num_lines` records of the chosen roles' files, merged in time
    order (a text record's traceback lines come with it), then with `keep_following` the new
    ones until Ctrl-C."""
    directory = log_dir(config)
    chosen = tuple(roles) if roles else (("worker",) if model is not None else ROLES)
    if model is not None and "worker" not in chosen:
        print("mlxd logs: --model picks a worker's log; add --role worker", file=sys.stderr)
        return 2
    if num_lines < 0:
        print(f"mlxd logs: -n must be >= 0, got {num_lines}", file=sys.stderr)
        return 2
    files = log_files(directory, chosen, model)
    if model is not None and not (directory / worker_log_name(model)).is_file() and not keep_following:
        models = ", ".join(logged_models(directory)) or "none"
        print(f"mlxd logs: no log file for model {model!r} in {directory} (models with logs: {models})",
              file=sys.stderr)
        return 1
    if not files and not keep_following:
        print(f"mlxd logs: no log files in {directory}: the service writes them once it has run with this "
              "home (see --log-dir, --log-files)", file=sys.stderr)
        return 1
    # each file is read through the handle that then follows it: no line is lost or
    # printed twice between the last lines and the new ones
    followers = {path: FileFollower(path) for path in files}
    try:
        newest = []
        for path, follower in followers.items():
            entries = tail(path, num_lines, follower.read_lines())
            if entries and entries[-1].time is not None:
                follower.last_time = entries[-1].time  # the time of traceback lines that come next
            newest.append(entries)
        for entry in merge(newest, num_lines):
            sys.stdout.write(entry.text + "\n")
        sys.stdout.flush()
        if keep_following:
            follow(directory, chosen, model, followers)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `mlxd logs | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
    finally:
        for follower in followers.values():
            follower.close()
    return 0
