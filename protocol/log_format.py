"""The log line format every process uses: one record is one line, whatever it quotes;
text for people or JSON for machines, on stderr and in the process's own rotating file.

Messages quote client input (model names, error texts); a newline or terminal escape in
it must not start a line of its own that reads like one the service wrote.
"""

from __future__ import annotations

import copy
import json
import logging
import logging.handlers
import os
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO

# C0 controls, DEL and C1 controls; \n, \r and \t get their usual short spelling
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_controls(text: str) -> str:
    """`text` with each control character spelled out (`\\n`, `\\x1b`)."""
    return _CONTROL.sub(lambda m: _SHORT.get(m.group(), f"\\x{ord(m.group()):02x}"), text)


class OneLineFormatter(logging.Formatter):
    """Escapes control characters in the message part of a record only: the traceback
    appended for `log.exception` stays multi-line (its lines are the service's own)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        escaped = copy.copy(record)  # other handlers may format the same record
        escaped.message = escape_controls(record.message)
        return super().formatMessage(escaped)


LOG_FORMATS = ("text", "json")
# Unicode line breaks and C1 controls, which json.dumps(ensure_ascii=False) leaves raw: a
# reader splitting on them (str.splitlines does) would cut one JSON line in two
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029]")


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line, for machines: ts (ISO 8601 with ms and the
    local offset), level, role, logger, msg, request_id when the record has one (`extra=`),
    exc (the whole traceback as one string). Non-ASCII text stays readable."""

    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created).astimezone().isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "role": self.role,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            entry["request_id"] = str(request_id)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)  # cached, as Formatter does
        if record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        text = json.dumps(entry, ensure_ascii=False, default=str)
        return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def make_formatter(log_format: str, role: str) -> logging.Formatter:
    """The formatter of `log_format` (LOG_FORMATS) for a process whose lines carry `role`:
    text is `date time LEVEL role logger: message`."""
    if log_format == "json":
        return JsonFormatter(role)
    if log_format != "text":
        raise ValueError(f"unknown log format {log_format!r}; one of {', '.join(LOG_FORMATS)}")
    role = escape_controls(role).replace("%", "%%")  # a model id becomes part of the format
    return OneLineFormatter(f"%(asctime)s %(levelname)s {role} %(name)s: %(message)s")


@dataclass(frozen=True)
class LogFile:
    """A process's own log file: at `max_bytes` (0: never) it becomes `.1`, the older ones
    shift up, and `backups` of them are kept (at least 1: with none, the handler would
    reopen the full file at every record)."""

    path: Path
    max_bytes: int
    backups: int


class PrivateRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """Rotating files created 0600 whatever the umask, also after a rotation: log lines
    quote prompts, model names and errors, which are the user's business only."""

    def _open(self) -> IO[str]:
        stream = open(self.baseFilename, self.mode, encoding=self.encoding, errors=self.errors,
                      opener=lambda path, flags: os.open(path, flags, 0o600))
        os.fchmod(stream.fileno(), 0o600)  # a file an older version left readable
        return stream


def configure_logging(level: str, role: str, log_format: str = "text") -> None:
    """Log to stderr with `role` on every line; once per process, at its entry point."""
    handler = logging.StreamHandler()  # stderr
    handler.setFormatter(make_formatter(log_format, role))
    logging.basicConfig(level=level.upper(), handlers=[handler])


def add_log_file(role: str, log_format: str, log_file: LogFile) -> None:
    """Also write every record to `log_file`, formatted as on stderr; OSError if it cannot
    be opened. Its directory must exist (the router makes it, private)."""
    handler = PrivateRotatingFileHandler(log_file.path, maxBytes=log_file.max_bytes,
                                         backupCount=log_file.backups, encoding="utf-8")
    handler.setFormatter(make_formatter(log_format, role))
    logging.getLogger().addHandler(handler)


# How the router tells the processes it starts to log as it does (children read these at
# once, before any handshake, so even a failing start logs at the right level and place).
LOG_LEVEL_ENV = "MLXD_LOG_LEVEL"
LOG_FORMAT_ENV = "MLXD_LOG_FORMAT"
LOG_FILE_ENV = "MLXD_LOG_FILE"  # the child's own file; empty: no file
LOG_MAX_BYTES_ENV = "MLXD_LOG_MAX_BYTES"
LOG_BACKUPS_ENV = "MLXD_LOG_BACKUPS"
# set by the launchd agent: once the files are open, stderr (a file launchd never rotates)
# gets only records at this level and above
STDERR_LEVEL_ENV = "MLXD_STDERR_LEVEL"


def child_log_env(level: str, log_format: str, log_file: LogFile | None) -> dict[str, str]:
    """The environment that makes a child log as `configure_child_logging` reads it."""
    env = {LOG_LEVEL_ENV: level, LOG_FORMAT_ENV: log_format, LOG_FILE_ENV: ""}
    if log_file is not None:
        env.update({LOG_FILE_ENV: str(log_file.path), LOG_MAX_BYTES_ENV: str(log_file.max_bytes),
                    LOG_BACKUPS_ENV: str(log_file.backups)})
    return env


def child_log_level() -> str:
    """A child process's log level: the router's, passed in LOG_LEVEL_ENV."""
    return os.environ.get(LOG_LEVEL_ENV, "INFO")


def configure_child_logging(role: str) -> None:
    """A child's logging as the router passed it (`child_log_env`): stderr, which the router
    forwards, and the child's own file. A file that cannot be opened is said on stderr and
    skipped: the child still runs and its lines still reach the router."""
    log_format = os.environ.get(LOG_FORMAT_ENV, "text")
    log_format = log_format if log_format in LOG_FORMATS else "text"
    configure_logging(child_log_level(), role, log_format)
    path = os.environ.get(LOG_FILE_ENV)
    if path:
        try:
            Path(path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # made by `mlxd serve` already
            add_log_file(role, log_format, LogFile(Path(path), int(os.environ.get(LOG_MAX_BYTES_ENV, "0")),
                                                   int(os.environ.get(LOG_BACKUPS_ENV, "1"))))
        except (OSError, ValueError) as exc:
            logging.getLogger(__name__).warning("cannot write log file %s (%s); logging to stderr only", path, exc)


_TEXT_HEAD = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


@dataclass(frozen=True)
class LineHead:
    """What a log line says of itself: when (timezone-aware) and at which level."""

    time: datetime
    level: str


def parse_line(line: str) -> LineHead | None:
    """The time and level of a line either format wrote; None for any other line (a text
    traceback's lines, a crash message a child printed itself)."""
    match = _TEXT_HEAD.match(line)
    if match:  # text lines are in local time, as %(asctime)s writes it
        return LineHead(datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").astimezone(), match[2])
    if not line.startswith("{"):
        return None
    try:
        entry = json.loads(line)
        return LineHead(datetime.fromisoformat(entry["ts"]).astimezone(), str(entry["level"]))
    except (ValueError, KeyError, TypeError):
        return None
