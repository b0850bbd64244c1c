"""`mlxd service`: the launchd plist and systemd unit rendered for this installation, and
the commands each action runs (checked with --dry-run, on both platforms, anywhere)."""

from __future__ import annotations

import configparser
import os
import plistlib
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from router.cli.service import plan
from router.cli.service_units import ServiceSettings, launchd_plist, systemd_quote, systemd_unit

EXECUTABLE = Path(sys.executable).parent / "mlxd"
SETTINGS = ServiceSettings(executable=EXECUTABLE, home=Path("/Users/me/mlxd home"), host="127.0.0.1", port=8123,
                           config=Path("/Users/me/mlxd.toml"), drain_s=5.0)
USER_HOME = Path("/Users/me")


def test_the_plist_parses_and_names_the_executable_home_and_config() -> None:
    unit = launchd_plist(SETTINGS, USER_HOME)
    assert unit.path == USER_HOME / "Library/LaunchAgents/local.mlxd.plist"
    plist = plistlib.loads(unit.text.encode())
    assert plist["Label"] == "local.mlxd"
    assert plist["ProgramArguments"] == [str(EXECUTABLE), "serve", "--home", "/Users/me/mlxd home", "--host",
                                         "127.0.0.1", "--port", "8123", "--config", "/Users/me/mlxd.toml"]
    assert plist["RunAtLoad"] is True and plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["ThrottleInterval"] >= 1 and plist["ExitTimeOut"] > SETTINGS.drain_s
    assert plist["ProcessType"] == "Interactive"
    assert plist["EnvironmentVariables"]["PATH"].split(":")[0] == str(EXECUTABLE.parent)
    assert plist["EnvironmentVariables"]["MLXD_STDERR_LEVEL"] == "warning"  # launchd never rotates stderr
    assert plist["StandardErrorPath"] == "/Users/me/mlxd home/logs/service.err.log"


def test_xml_special_characters_are_escaped() -> None:
    odd = ServiceSettings(EXECUTABLE, Path("/tmp/a&b<c>"), "127.0.0.1", 8000, None, 5.0)
    plist = plistlib.loads(launchd_plist(odd, USER_HOME).text.encode())
    assert plist["ProgramArguments"][3] == "/tmp/a&b<c>" and "--config" not in plist["ProgramArguments"]


def _unit_sections(text: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string(text)
    return parser


def test_the_systemd_unit_restarts_on_failure_and_stops_after_the_drain() -> None:
    unit = systemd_unit(SETTINGS, USER_HOME)
    assert unit.path == USER_HOME / ".config/systemd/user/mlxd.service"
    sections = _unit_sections(unit.text)
    assert set(sections.sections()) == {"Unit", "Service", "Install"}
    service = sections["Service"]
    assert shlex.split(service["ExecStart"]) == [str(EXECUTABLE), "serve", "--home", "/Users/me/mlxd home", "--host",
                                                 "127.0.0.1", "--port", "8123", "--config", "/Users/me/mlxd.toml"]
    assert service["Restart"] == "on-failure" and service["KillSignal"] == "SIGTERM"
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"  # SIGHUP: re-read the config
    assert int(service["TimeoutStopSec"]) > SETTINGS.drain_s
    assert sections["Install"]["WantedBy"] == "default.target"


def test_systemd_quoting() -> None:
    assert systemd_quote("/usr/bin/mlxd") == "/usr/bin/mlxd"
    assert systemd_quote("/a b") == '"/a b"'
    assert systemd_quote("100%") == "100%%" and systemd_quote("$HOME") == "$$HOME"
    assert systemd_quote('say "hi"') == '"say \\"hi\\""'


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    settings = ServiceSettings(EXECUTABLE, tmp_path / "home", "127.0.0.1", 8000, None, 5.0)
    unit = systemd_unit(settings, tmp_path)
    unit.path.parent.mkdir(parents=True)
    unit.path.write_text(unit.text)
    done = subprocess.run(["systemd-analyze", "verify", str(unit.path)], capture_output=True, text=True,
                          check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "mlxd.service" not in done.stderr, done.stderr  # no warning about this unit


@pytest.mark.parametrize("platform, action, commands", [
    ("macos", "install", [["launchctl", "bootout", "gui/501/local.mlxd"],
                          ["launchctl", "bootstrap", "gui/501", "/Users/me/Library/LaunchAgents/local.mlxd.plist"]]),
    ("macos", "restart", [["launchctl", "bootstrap", "gui/501", "/Users/me/Library/LaunchAgents/local.mlxd.plist"],
                          ["launchctl", "kickstart", "-k", "gui/501/local.mlxd"]]),
    ("macos", "stop", [["launchctl", "bootout", "gui/501/local.mlxd"]]),
    ("linux", "install", [["systemctl", "--user", "daemon-reload"], ["systemctl", "--user", "enable", "mlxd.service"],
                          ["systemctl", "--user", "restart", "mlxd.service"]]),
    ("linux", "uninstall", [["systemctl", "--user", "disable", "--now", "mlxd.service"],
                            ["systemctl", "--user", "daemon-reload"]]),
    ("linux", "status", [["systemctl", "--user", "status", "--no-pager", "mlxd.service"]]),
    ("macos", "reload", [["launchctl", "kill", "SIGHUP", "gui/501/local.mlxd"]]),
    ("linux", "reload", [["systemctl", "--user", "reload", "mlxd.service"]]),
    *[(platform, "logs", [[str(EXECUTABLE), "logs", "--home", "/Users/me/mlxd home", "--config", "/Users/me/mlxd.toml",
                           "-n", "100"]]) for platform in ("macos", "linux")],  # the log files, on both
])
def test_each_action_runs_the_managers_commands(platform: str, action: str, commands: list[list[str]]) -> None:
    steps = plan(action, platform, SETTINGS, USER_HOME, 501)
    assert [list(step.command) for step in steps if step.command] == commands


def _mlxd(*args: str, home: Path, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(home), "MLXD_HOME": str(home / ".mlxd")}
    if path is not None:
        env["PATH"] = path
    return subprocess.run([sys.executable, "-m", "router", *args], capture_output=True, text=True, env=env,
                          check=False, timeout=60)


@pytest.mark.parametrize("platform, unit_path, command", [
    ("macos", "Library/LaunchAgents/local.mlxd.plist", "run: launchctl bootstrap gui/"),
    ("linux", ".config/systemd/user/mlxd.service", "run: systemctl --user enable mlxd.service"),
])
def test_install_dry_run_prints_the_unit_and_commands_and_writes_nothing(tmp_path: Path, platform: str,
                                                                         unit_path: str, command: str) -> None:
    done = _mlxd("service", "install", "--dry-run", "--platform", platform, "--port", "8123", home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"write {tmp_path / unit_path}:" in done.stdout and command in done.stdout
    assert "--port 8123" in done.stdout or "<string>8123</string>" in done.stdout
    assert not (tmp_path / unit_path).exists()


def test_a_missing_manager_is_named_and_fails(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    done = _mlxd("service", "start", "--platform", "macos", home=tmp_path, path=str(empty))
    assert done.returncode == 1
    assert "`launchctl` is not on this system" in done.stderr
