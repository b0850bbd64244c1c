"""The log line format every process uses: one record is one line, whatever it quotes.

Messages quote client input (model names, error texts); a newline or terminal escape in
it must not start a line of its own that reads like one the service wrote.
"""

from __future__ import annotations

import copy
import logging
import os
import re

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


# How the router hands its --log-level to the processes it starts (children read it at once,
# before any handshake, so even a failing start logs at the right level).
LOG_LEVEL_ENV = "MLXD_LOG_LEVEL"


def child_log_level() -> str:
    """A child process's log level: the router's, passed in LOG_LEVEL_ENV."""
    return os.environ.get(LOG_LEVEL_ENV, "INFO")


def configure_logging(level: str, role: str) -> None:
    """Log to stderr with `role` on every line; once per process, at its entry point."""
    role = escape_controls(role).replace("%", "%%")  # a model id becomes part of the format
    handler = logging.StreamHandler()  # stderr
    handler.setFormatter(OneLineFormatter(f"%(asctime)s %(levelname)s {role} %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])
