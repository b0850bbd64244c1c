"""`mlxd service install|uninstall|start|stop|restart|reload|status|logs`: mlxd under launchd
(a user agent in gui/$UID) on macOS and a systemd user service on Linux.

Each action is a plan of steps (write or remove the unit file, run a manager command),
so `--dry-run` prints exactly what a real run does. Every action is idempotent: steps
that only fail because the job is already (un)loaded are allowed to fail.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from router.cli import wait
from router.cli.service_file import find_service
from router.cli.service_units import (
    LAUNCHD_LABEL,
    SYSTEMD_UNIT,
    ServiceSettings,
    UnitFile,
    launchd_plist,
    systemd_unit,
)
from router.cli.settings_flags import SERVICE_ADDRESS, add_setting_flags, with_settings
from router.config_file import LoadedConfig

ACTIONS = ("install", "uninstall", "start", "stop", "restart", "reload", "status", "logs")
PLATFORMS = {"darwin": "macos", "linux": "linux"}
# `systemctl --user` fails this way where no user manager runs (containers, ssh without a session)
SYSTEMD_HINT = ("; if it said it cannot connect to the bus, no systemd user manager runs for this user: "
                "log in to a user session, or keep one running with `loginctl enable-linger $USER`")


def add_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "service",
        help="run mlxd as a background service (launchd on macOS, systemd --user on Linux)",
        description="install renders the launchd agent (~/Library/LaunchAgents/local.mlxd.plist) or the "
                    "systemd user unit (~/.config/systemd/user/mlxd.service) for this installation's mlxd, "
                    "home, address and config file, and starts it at login; the other actions drive "
                    "launchctl or systemctl --user. Every action is idempotent.",
    )
    parser.add_argument("action", choices=ACTIONS, help="what to do")
    parser.add_argument("--dry-run", action="store_true", help="print the files and commands, change nothing")
    parser.add_argument("--platform", choices=sorted(set(PLATFORMS.values())), default=None,
                        help="render for this platform (default: this machine's)")
    parser.add_argument("-f", "--follow", action="store_true", help="logs: keep printing new lines")
    parser.add_argument("-n", "--lines", type=int, default=100, help="logs: how many lines (default 100)")
    parser.add_argument("--wait", action="store_true",
                        help="start/restart: then wait until the service is ready (see `mlxd wait`)")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                        help="with --wait: give up after this long (default 600)")
    add_setting_flags(parser, only=(*SERVICE_ADDRESS, "shutdown_drain_s"))
    parser.set_defaults(run=with_settings("service", run))


def run(loaded: LoadedConfig, args: argparse.Namespace) -> int:
    """`mlxd service ACTION`: the unit for this installation, and the manager's commands."""
    config = loaded.config
    platform = args.platform or current_platform()
    if platform is None:
        print(f"mlxd service: no service manager mlxd knows on {sys.platform} (launchd on macOS, "
              "systemd on Linux); run `mlxd serve` under your own supervisor", file=sys.stderr)
        return 1
    executable = find_executable()
    if executable is None:
        print("mlxd service: cannot find the installed `mlxd` (run `make install`)", file=sys.stderr)
        return 1
    settings = ServiceSettings(executable=executable, home=config.home.resolve(), host=config.host,
                               port=config.port, config=config.config.resolve() if config.config else None,
                               drain_s=config.shutdown_drain_s)
    steps = plan(args.action, platform, settings, user_home(), os.getuid(), follow=args.follow, lines=args.lines)
    code = execute(steps, args.dry_run)
    if args.action == "status" and not args.dry_run:  # whoever started it: the home names its service
        running = find_service(config.home)
        print(f"mlxd: serving home {config.home} on {running.url} (pid {running.pid})" if running is not None
              else f"mlxd: no mlxd is serving home {config.home}")
    if code == 0 and args.wait and args.action in ("start", "restart", "install") and not args.dry_run:
        return wait.wait_command(config, args.timeout)
    return code


@dataclass(frozen=True)
class Step:
    """Write `unit`, remove `remove`, make the directory `mkdir`, or run `command`
    (`may_fail`: an exit status that only says the job was already in the wanted state)."""

    command: tuple[str, ...] = ()
    unit: UnitFile | None = None
    remove: Path | None = None
    mkdir: Path | None = None
    may_fail: bool = False


def current_platform() -> str | None:
    return PLATFORMS.get(sys.platform)


def plan(action: str, platform: str, settings: ServiceSettings, user_home: Path, uid: int,
         follow: bool = False, lines: int = 100) -> list[Step]:
    """The steps of `action` on `platform` ("macos" or "linux")."""
    if platform == "macos":
        return _launchd_plan(action, settings, user_home, uid, follow, lines)
    return _systemd_plan(action, settings, user_home, follow, lines)


def _launchd_plan(action: str, settings: ServiceSettings, user_home: Path, uid: int, follow: bool,
                  lines: int) -> list[Step]:
    unit = launchd_plist(settings, user_home)
    domain, target = f"gui/{uid}", f"gui/{uid}/{LAUNCHD_LABEL}"
    load = ("launchctl", "bootstrap", domain, str(unit.path))
    bootstrap = Step(load, may_fail=True)  # fails if loaded
    bootout = Step(("launchctl", "bootout", target), may_fail=True)  # fails if not loaded
    steps = {
        # bootout first so a changed plist is the one loaded; RunAtLoad starts it.
        # launchd opens the log files but does not make their directory
        "install": [Step(unit=unit), Step(mkdir=settings.log_dir), bootout, Step(load)],
        "uninstall": [bootout, Step(remove=unit.path)],
        "start": [bootstrap, Step(("launchctl", "kickstart", target))],
        "stop": [bootout],
        "restart": [bootstrap, Step(("launchctl", "kickstart", "-k", target))],
        "reload": [Step(("launchctl", "kill", "SIGHUP", target))],  # re-reads config and keys
        "status": [Step(("launchctl", "print", target))],
        "logs": [_logs(settings, follow, lines)],
    }
    return steps[action]


def _systemd_plan(action: str, settings: ServiceSettings, user_home: Path, follow: bool,
                  lines: int) -> list[Step]:
    unit = systemd_unit(settings, user_home)

    def ctl(*args: str, may_fail: bool = False) -> Step:
        return Step(("systemctl", "--user", *args), may_fail=may_fail)

    steps = {
        "install": [Step(unit=unit), ctl("daemon-reload"), ctl("enable", SYSTEMD_UNIT),
                    ctl("restart", SYSTEMD_UNIT)],
        "uninstall": [ctl("disable", "--now", SYSTEMD_UNIT, may_fail=True), Step(remove=unit.path),
                      ctl("daemon-reload")],
        "start": [ctl("start", SYSTEMD_UNIT)],
        "stop": [ctl("stop", SYSTEMD_UNIT)],
        "restart": [ctl("restart", SYSTEMD_UNIT)],
        "reload": [ctl("reload", SYSTEMD_UNIT)],  # ExecReload: SIGHUP, re-reads config and keys
        "status": [ctl("status", "--no-pager", SYSTEMD_UNIT)],
        "logs": [_logs(settings, follow, lines)],
    }
    return steps[action]


def _logs(settings: ServiceSettings, follow: bool, lines: int) -> Step:
    """`mlxd logs` on the service's home: the files each process writes, read the same way
    on both platforms. What the manager caught itself (output before logging began, such as
    a bad config file) stays in `journalctl --user -u mlxd.service` or HOME/logs/service.err.log."""
    config = ("--config", str(settings.config)) if settings.config is not None else ()
    return Step((str(settings.executable), "logs", "--home", str(settings.home), *config, "-n", str(lines),
                 *(("-f",) if follow else ())))


def describe(step: Step) -> str:
    if step.unit is not None:
        return f"write {step.unit.path}:\n{step.unit.text}"
    if step.remove is not None:
        return f"remove {step.remove}"
    if step.mkdir is not None:
        return f"mkdir -p {step.mkdir}"
    return "run: " + " ".join(step.command) + ("  (may fail: already in that state)" if step.may_fail else "")


def execute(steps: list[Step], dry_run: bool) -> int:
    """Carry out (or, dry, print) the steps; the exit status of the first one that
    fails for real, else 0 (a `status` step's own status passes through)."""
    if dry_run:
        for step in steps:
            print(describe(step))
        return 0
    managers = {step.command[0] for step in steps if step.command}
    for manager in sorted(managers):
        if shutil.which(manager) is None:
            print(f"mlxd service: `{manager}` is not on this system, so mlxd cannot be run as a service by it; "
                  "run `mlxd serve` under your own supervisor", file=sys.stderr)
            return 1
    for step in steps:
        if step.unit is not None:
            step.unit.path.parent.mkdir(parents=True, exist_ok=True)
            if not step.unit.path.exists() or step.unit.path.read_text() != step.unit.text:
                step.unit.path.write_text(step.unit.text)
                print(f"wrote {step.unit.path}")
            continue
        if step.remove is not None:
            if step.remove.exists():
                step.remove.unlink()
                print(f"removed {step.remove}")
            continue
        if step.mkdir is not None:
            step.mkdir.mkdir(mode=0o700, parents=True, exist_ok=True)
            continue
        status = subprocess.run(step.command, check=False).returncode
        if status != 0 and not step.may_fail:
            hint = SYSTEMD_HINT if step.command[:2] == ("systemctl", "--user") else ""
            print(f"mlxd service: `{' '.join(step.command)}` exited with {status}{hint}", file=sys.stderr)
            return status
    return 0


def find_executable() -> Path | None:
    """The `mlxd` of this installation (the venv's, next to this Python), else PATH's."""
    beside = Path(sys.executable).parent / "mlxd"
    if beside.exists():
        return beside.resolve()
    found = shutil.which("mlxd")
    return Path(found).resolve() if found else None


def user_home() -> Path:
    return Path(os.path.expanduser("~"))
