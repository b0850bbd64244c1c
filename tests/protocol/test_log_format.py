"""protocol.log_format: a record is one line, whatever client text it quotes; a
traceback stays readable (text) or is one field of the line (json); files are private and
rotate; a child logs where the router's environment says."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol.log_format import (
    LOG_FORMATS,
    LogFile,
    OneLineFormatter,
    PrivateRotatingFileHandler,
    child_log_env,
    escape_controls,
    make_formatter,
    parse_line,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(OneLineFormatter("%(levelname)s router %(name)s: %(message)s"))
    logger = logging.getLogger("test-log-format")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield logger, out
    finally:
        logger.removeHandler(handler)


@pytest.mark.parametrize("text, expected", [
    ("plain", "plain"),
    ("x\nINFO fake line", "x\\nINFO fake line"),
    ("a\r\nb", "a\\r\\nb"),
    ("tab\there", "tab\\there"),
    ("\x1b[2J\x1b[31mred", "\\x1b[2J\\x1b[31mred"),
    ("nul\x00 del\x7f", "nul\\x00 del\\x7f"),
    ("c1 \x85 nel \x9b csi", "c1 \\x85 nel \\x9b csi"),
    ("unicode é ✓ 中 stays", "unicode é ✓ 中 stays"),
    ("back\\slash", "back\\slash"),
])
def test_escape_controls(text: str, expected: str) -> None:
    assert escape_controls(text) == expected


def test_a_newline_in_an_argument_cannot_start_a_line(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = captured
    logger.info("POST %s -> 404 The model '%s' does not exist", "/v1/chat/completions", "x\nINFO router fake: line")
    assert out.getvalue().splitlines() == [
        "INFO router test-log-format: POST /v1/chat/completions -> 404 The model 'x\\nINFO router fake: line' "
        "does not exist"
    ]


def test_the_traceback_stays_multi_line(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = captured
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("stream %s failed", "a\nb")
    lines = out.getvalue().splitlines()
    assert lines[0] == "ERROR router test-log-format: stream a\\nb failed"
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: boom"


def test_other_handlers_see_the_record_unchanged(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = captured
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    keep = Keep()
    logger.addHandler(keep)
    try:
        logger.info("%s", "a\nb")
    finally:
        logger.removeHandler(keep)
    assert seen == ["a\nb"] and out.getvalue() == "INFO router test-log-format: a\\nb\n"


@pytest.mark.parametrize("setup", [
    "from router.cli.serve import configure_logging; configure_logging('info')",
    "from protocol.log_format import configure_logging; configure_logging('INFO', 'worker[m%s\\n]')",
])
def test_a_process_logs_one_line_per_record(setup: str) -> None:
    code = f"{setup}\nimport logging\nlogging.getLogger('x').info('model %s', 'a\\nINFO fake')"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert result.stderr.rstrip().endswith("x: model a\\nINFO fake")


@pytest.fixture
def json_captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(make_formatter("json", "worker[m#1]"))
    logger = logging.getLogger("test-log-format-json")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield logger, out
    finally:
        logger.removeHandler(handler)


def test_a_json_line_has_the_fields(json_captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = json_captured
    logger.info("model %s loaded", "smol")
    [line] = out.getvalue().splitlines()
    entry = json.loads(line)
    assert entry.keys() == {"ts", "level", "role", "logger", "msg"}
    assert (entry["level"], entry["role"], entry["logger"], entry["msg"]) == (
        "INFO", "worker[m#1]", "test-log-format-json", "model smol loaded")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d", entry["ts"]), entry["ts"]


def test_a_json_record_is_one_line_with_its_traceback_and_request_id(
        json_captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = json_captured
    quoted = "a\nINFO router fake: line\r\x1b[2K \x85 \u2028 é"
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        logger.exception("stream %s failed", quoted, extra={"request_id": "chatcmpl-42"})
    text = out.getvalue()
    assert text.count("\n") == 1 and len(text.splitlines()) == 1  # splitlines also cuts at \x85 and \u2028
    entry = json.loads(text)
    assert entry["msg"] == f"stream {quoted} failed"
    assert entry["request_id"] == "chatcmpl-42"
    assert entry["exc"].startswith("Traceback (most recent call last):\n")
    assert entry["exc"].endswith("ValueError: boom\nsecond line")


@pytest.mark.parametrize("log_format", LOG_FORMATS)
def test_parse_line_reads_what_a_formatter_wrote(log_format: str) -> None:
    record = logging.LogRecord("x.y", logging.WARNING, __file__, 1, "disk %s", ("full",), None)
    line = make_formatter(log_format, "kvstore").format(record)
    head = parse_line(line)
    assert head is not None and head.level == "WARNING"
    assert abs(head.time.timestamp() - record.created) < 0.001  # ms precision, either format


@pytest.mark.parametrize("line", [
    "Traceback (most recent call last):",
    '  File "x.py", line 3, in f',
    "{not json",
    '{"msg": "no ts"}',
    "2026-11-30 fatal: out of memory",
    "",
])
def test_other_lines_are_not_log_lines(line: str) -> None:
    assert parse_line(line) is None


def test_log_files_are_private_and_rotate(tmp_path: Path) -> None:
    handler = PrivateRotatingFileHandler(tmp_path / "kvstore.log", maxBytes=200, backupCount=2, encoding="utf-8")
    handler.setFormatter(make_formatter("text", "kvstore"))
    old_umask = os.umask(0o022)
    try:
        for number in range(20):
            handler.emit(logging.LogRecord("x", logging.INFO, __file__, 1, "record %d %s", (number, "." * 40), None))
    finally:
        os.umask(old_umask)
        handler.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["kvstore.log", "kvstore.log.1", "kvstore.log.2"]
    assert {stat.S_IMODE((tmp_path / name).stat().st_mode) for name in files} == {0o600}
    assert all((tmp_path / name).stat().st_size <= 200 for name in files)
    assert (tmp_path / "kvstore.log").read_text().splitlines()[-1].endswith("record 19 " + "." * 40)


def test_a_child_logs_where_the_router_says(tmp_path: Path) -> None:
    log_file = LogFile(tmp_path / "logs" / "worker-m.log", max_bytes=1 << 20, backups=1)
    code = ("from protocol.log_format import configure_child_logging; configure_child_logging('worker[m#1]')\n"
            "import logging; logging.getLogger('w').debug('hidden'); logging.getLogger('w').info('hello')")
    env = {**os.environ, **child_log_env("info", "json", log_file)}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                            env=env, check=False)
    assert result.returncode == 0, result.stderr
    [written] = log_file.path.read_text().splitlines()
    assert written == result.stderr.strip()  # the same line on stderr and in the file
    assert json.loads(written)["msg"] == "hello" and json.loads(written)["role"] == "worker[m#1]"
    assert stat.S_IMODE(log_file.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(log_file.path.parent.stat().st_mode) == 0o700
