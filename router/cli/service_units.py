"""The service manager's files for this installation: a launchd agent plist (macOS) and a
systemd user unit (Linux), rendered from the templates in `deploy/`.

Pure: paths and text in, text out, so `--dry-run` and the tests see exactly what would be
installed. The templates live in the source tree (mlxd is installed editable, as
`make serve` does, and runs from it).
"""

from __future__ import annotations

import math
import os
import string
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

from protocol.log_format import STDERR_LEVEL_ENV

DEPLOY_DIR = Path(__file__).resolve().parents[2] / "deploy"
LAUNCHD_LABEL = "local.mlxd"
SYSTEMD_UNIT = "mlxd.service"
THROTTLE_S = 10  # at most one restart per this many seconds
# after SIGTERM: the drain deadline, then stopping workers and flushing the kvstore
STOP_MARGIN_S = 30


@dataclass(frozen=True)
class ServiceSettings:
    """What the unit must name: the installed `mlxd`, and `serve`'s home, address and
    config file (None: the home's own config.toml, read by default)."""

    executable: Path
    home: Path
    host: str
    port: int
    config: Path | None
    drain_s: float

    def serve_arguments(self) -> list[str]:
        args = [str(self.executable), "serve", "--home", str(self.home), "--host", self.host,
                "--port", str(self.port)]
        if self.config is not None:
            args += ["--config", str(self.config)]
        return args

    def environment(self) -> dict[str, str]:
        # launchd and systemd start with a bare environment: the venv first on PATH,
        # and unbuffered output so the log files are current
        path = os.pathsep.join(dict.fromkeys([str(self.executable.parent), "/usr/local/bin", "/usr/bin", "/bin"]))
        return {"PATH": path, "PYTHONUNBUFFERED": "1"}

    @property
    def stop_timeout_s(self) -> int:
        return math.ceil(self.drain_s) + STOP_MARGIN_S

    @property
    def log_dir(self) -> Path:
        return self.home / "logs"


@dataclass(frozen=True)
class UnitFile:
    path: Path
    text: str


def _template(name: str) -> string.Template:
    return string.Template((DEPLOY_DIR / name).read_text())


def launchd_plist(settings: ServiceSettings, user_home: Path) -> UnitFile:
    """The agent plist, for ~/Library/LaunchAgents."""
    arguments = "\n".join(f"    <string>{escape(a)}</string>" for a in settings.serve_arguments())
    # launchd never rotates service.err.log: past start-up only warnings go there
    variables = {**settings.environment(), STDERR_LEVEL_ENV: "warning"}
    environment = "\n".join(f"    <key>{escape(k)}</key>\n    <string>{escape(v)}</string>"
                            for k, v in variables.items())
    text = _template("local.mlxd.plist.in").substitute(
        label=LAUNCHD_LABEL, program_arguments=arguments, throttle_s=THROTTLE_S,
        stop_timeout_s=settings.stop_timeout_s, environment=environment,
        stdout_path=escape(str(settings.log_dir / "service.out.log")),
        stderr_path=escape(str(settings.log_dir / "service.err.log")))
    return UnitFile(user_home / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist", text)


def systemd_quote(value: str) -> str:
    """One word of a systemd command line or setting: `%` and `$` escaped (systemd
    expands them), double-quoted with backslash escapes when it holds space or quotes."""
    value = value.replace("%", "%%").replace("$", "$$")
    if value and not any(c in value for c in " \t\"'\\"):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_unit(settings: ServiceSettings, user_home: Path) -> UnitFile:
    """The user unit, for ~/.config/systemd/user."""
    environment = "\n".join(f"Environment={systemd_quote(f'{k}={v}')}" for k, v in settings.environment().items())
    text = _template("mlxd.service.in").substitute(
        unit=SYSTEMD_UNIT, readme=DEPLOY_DIR.parent / "README.md",
        exec_start=" ".join(systemd_quote(a) for a in settings.serve_arguments()),
        environment=environment, throttle_s=THROTTLE_S,
        stop_timeout_s=settings.stop_timeout_s)
    return UnitFile(user_home / ".config" / "systemd" / "user" / SYSTEMD_UNIT, text)
