"""`mlxd logs`: the last records of the chosen roles' files merged in time order (both
formats, tracebacks kept with their record, rotated files reached into), and following new
lines across a rotation. The files are written by the real formatters and rotating handler."""

from __future__ import annotations

import logging
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from protocol.log_format import PrivateRotatingFileHandler, make_formatter
from router.config import make_config
from router.log_files import worker_log_name
from router.cli.log_records import FileFollower, merge, records, tail
from router.cli.logs import logs_command

REPO = Path(__file__).resolve().parents[2]
START = 1_800_000_000.0  # the time of the first record each test writes


def record(seconds: float, message: str, exc: bool = False) -> logging.LogRecord:
    """A record logged `seconds` after START (so tests order lines by time, not by write)."""
    exc_info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            exc_info = sys.exc_info()
    entry = logging.LogRecord("t", logging.INFO, __file__, 1, message, None, exc_info)
    entry.created = START + seconds
    entry.msecs = (entry.created % 1) * 1000
    return entry


def write(path: Path, log_format: str, role: str, *entries: logging.LogRecord) -> None:
    formatter = make_formatter(log_format, role)
    with path.open("a") as f:
        for entry in entries:
            f.write(formatter.format(entry) + "\n")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A home whose log directory holds a router (text), kvstore (json) and two workers' files."""
    logs = tmp_path / "logs"
    logs.mkdir()
    write(logs / "router.log", "text", "router", record(0, "r0"), record(3, "r3", exc=True), record(6, "r6"))
    write(logs / "kvstore.log", "json", "kvstore", record(1, "k1"), record(4, "k4", exc=True))
    write(logs / worker_log_name("org/smol"), "text", "worker[org/smol#1]", record(2, "w2"), record(7, "w7"))
    write(logs / worker_log_name("qwen"), "json", "worker[qwen#1]", record(5, "q5"))
    return tmp_path


def messages(text: str) -> list[str]:
    """The message of each record line printed (text `...: MSG` or json `"msg": "MSG"`)."""
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            out.append(line.split('"msg": "')[1].split('"')[0])
        elif line[:4].isdigit():
            out.append(line.rsplit(": ", 1)[1])
    return out


def run_logs(home: Path, roles: list[str] | None = None, model: str | None = None, num_lines: int = 100) -> int:
    return logs_command(make_config({"home": home}), roles, model, num_lines, keep_following=False)


def test_records_keep_their_traceback_lines() -> None:
    lines = ["2026-01-01 10:00:00,000 ERROR router x: failed", "Traceback (most recent call last):",
             '  File "x.py", line 1', "ValueError: boom", "2026-01-01 10:00:01,000 INFO router x: next"]
    assert [entry.lines for entry in records(lines)] == [lines[:4], lines[4:]]


def test_all_roles_merge_in_time_order(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_logs(home) == 0
    out = capsys.readouterr().out
    assert messages(out) == ["r0", "k1", "w2", "r3", "k4", "q5", "r6", "w7"]
    router_traceback = out.split("r3\n")[1].split("\n{")[0].splitlines()  # the text record's traceback, whole
    assert router_traceback[0] == "Traceback (most recent call last):" and router_traceback[-1] == "ValueError: boom"


def test_n_keeps_the_newest(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_logs(home, num_lines=3) == 0
    assert messages(capsys.readouterr().out) == ["q5", "r6", "w7"]


@pytest.mark.parametrize("roles, model, expected", [
    (["router"], None, ["r0", "r3", "r6"]),
    (["kvstore"], None, ["k1", "k4"]),
    (["worker"], None, ["w2", "q5", "w7"]),
    (None, "org/smol", ["w2", "w7"]),
    (["router", "worker"], "qwen", ["r0", "r3", "q5", "r6"]),
])
def test_roles_and_model_choose_the_files(home: Path, capsys: pytest.CaptureFixture[str], roles: list[str] | None,
                                          model: str | None, expected: list[str]) -> None:
    assert run_logs(home, roles, model) == 0
    assert messages(capsys.readouterr().out) == expected


def test_an_unknown_model_names_those_with_logs(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_logs(home, model="llama") == 1
    assert "models with logs: org/smol, qwen" in capsys.readouterr().err


def test_no_log_files_is_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_logs(tmp_path) == 1
    assert f"no log files in {tmp_path / 'logs'}" in capsys.readouterr().err


def rotating(path: Path, max_bytes: int = 300, backups: int = 3) -> PrivateRotatingFileHandler:
    handler = PrivateRotatingFileHandler(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
    handler.setFormatter(make_formatter("text", "kvstore"))
    return handler


def test_tail_reaches_into_rotated_files(tmp_path: Path) -> None:
    path = tmp_path / "kvstore.log"
    handler = rotating(path)
    for number in range(20):
        handler.emit(record(number, f"m{number}"))
    handler.close()
    assert path.with_name("kvstore.log.2").exists()
    newest = tail(path, 9)
    assert [entry.text.rsplit(": ", 1)[1] for entry in newest] == [f"m{n}" for n in range(11, 20)]
    assert [e.time for e in merge([newest], 100)] == [e.time for e in newest]  # already in time order


def test_the_follower_reads_across_rotations(tmp_path: Path) -> None:
    path = tmp_path / "kvstore.log"
    handler = rotating(path)
    handler.emit(record(0, "before"))
    follower = FileFollower(path)
    assert [line.rsplit(": ", 1)[1] for line in follower.read_lines()] == ["before"]
    seen: list[str] = []
    for number in range(12):  # several rotations, read between some of them only
        handler.emit(record(number, f"m{number}"))
        if number % 5 == 4:
            seen += follower.read_lines()
    seen += follower.read_lines()
    handler.close()
    follower.close()
    assert path.with_name("kvstore.log.1").exists()
    assert [line.rsplit(": ", 1)[1] for line in seen] == [f"m{n}" for n in range(12)]


def ctrl_c_as_a_terminal_sends_it() -> None:
    """A suite started in the background (`make test &`) ignores SIGINT, and a child
    inherits that; the command under test must get the Ctrl-C a terminal would send."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_mlxd_logs_f_follows_until_ctrl_c(home: Path) -> None:
    router_log = home / "logs" / "router.log"
    process = subprocess.Popen([sys.executable, "-m", "router", "logs", "-f", "-n", "1", "--role", "router",
                                "--home", str(home)], cwd=REPO, stdout=subprocess.PIPE, text=True,
                               preexec_fn=ctrl_c_as_a_terminal_sends_it)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()  # type: ignore[union-attr]
    try:
        assert messages(lines.get(timeout=30)) == ["r6"]  # the last record, then new ones
        handler = rotating(router_log, max_bytes=router_log.stat().st_size + 100)
        for number in range(4):  # the second one rotates the file
            handler.emit(record(10 + number, f"new{number}"))
        handler.close()
        assert router_log.with_name("router.log.1").exists()
        got = [messages(lines.get(timeout=10))[0] for _ in range(4)]
        assert got == ["new0", "new1", "new2", "new3"]
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=10) == 130
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
