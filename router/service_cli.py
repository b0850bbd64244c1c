"""`mlxd service install|uninstall|start|stop|restart|reload|status|logs`: mlxd under launchd
(a user agent in gui/$UID) on macOS and a systemd user service on Linux.

Each action is a plan of steps (write or remove the unit file, run a manager command),
so `--dry-run` prints exactly what a real run does. Every action is idempotent: steps
that only fail because the job is already (un)loaded are allowed to fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from router.service_units import LAUNCHD_LABEL, SYSTEMD_UNIT, ServiceSettings, UnitFile, launchd_plist, systemd_unit

ACTIONS = ("install", "uninstall", "start", "stop", "restart", "reload", "status", "logs")
PLATFORMS = {"darwin": "macos", "linux": "linux"}
# `systemctl --user` fails this way where no user manager runs (containers, ssh without a session)
SYSTEMD_HINT = ("; if it said it cannot connect to the bus, no systemd user manager runs for this user: "
                "log in to a user session, or keep one running with `loginctl enable-linger $USER`")


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


def run(steps: list[Step], dry_run: bool) -> int:
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
