"""protocol.log_format: a record is one line, whatever client text it quotes; a
traceback stays readable."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol.log_format import OneLineFormatter, escape_controls

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
    "from router.cli import configure_logging; configure_logging('info')",
    "from protocol.log_format import configure_logging; configure_logging('INFO', 'worker[m%s\\n]')",
])
def test_a_process_logs_one_line_per_record(setup: str) -> None:
    code = f"{setup}\nimport logging\nlogging.getLogger('x').info('model %s', 'a\\nINFO fake')"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert result.stderr.rstrip().endswith("x: model a\\nINFO fake")
