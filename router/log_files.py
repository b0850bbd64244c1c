"""The service's log files: which process writes which file under `log_dir` (router.log,
kvstore.log, worker-MODEL.log), how the router sets up its own logging, and how it tells
each child to log (level, format, its file).

Every process writes its own file; the router passes children's log lines through to its
stderr as they are (one timestamp, the child's role) and writes only its own to router.log.
"""

from __future__ import annotations

import logging
import os
import sys
import urllib.parse
from pathlib import Path

from protocol import log_format
from protocol.messages import WORKER_ROLE
from router.children.child_process import output_logger
from router.config import RouterConfig

logger = logging.getLogger(__name__)

ROUTER_LOG = "router.log"
KVSTORE_LOG = "kvstore.log"
WORKER_LOG_PREFIX = "worker-"
LOG_SUFFIX = ".log"


def log_dir(config: RouterConfig) -> Path:
    """Where the log files are: `log_dir`, else HOME/logs."""
    return config.log_dir if config.log_dir is not None else config.home / "logs"


def worker_log_name(model_id: str) -> str:
    """`worker-MODEL.log`, the model id percent-encoded (`/` -> `%2F`) so that any id is one
    file name and two ids never share a file."""
    return f"{WORKER_LOG_PREFIX}{urllib.parse.quote(model_id, safe='-_.')}{LOG_SUFFIX}"


def worker_model(file_name: str) -> str | None:
    """The model id a worker's log file is named for; None for other files."""
    if not (file_name.startswith(WORKER_LOG_PREFIX) and file_name.endswith(LOG_SUFFIX)):
        return None
    return urllib.parse.unquote(file_name[len(WORKER_LOG_PREFIX):-len(LOG_SUFFIX)])


def log_file(config: RouterConfig, file_name: str) -> log_format.LogFile | None:
    """The rotating file `file_name` under the log directory; None when files are off."""
    if not config.log_files:
        return None
    return log_format.LogFile(log_dir(config) / file_name, config.log_max_bytes, config.log_backups)


def child_log_env(config: RouterConfig, role: str, name: str) -> dict[str, str]:
    """The environment a child of `role` (a worker for model `name`, or the kvstore) logs by."""
    file_name = worker_log_name(name) if role == WORKER_ROLE else KVSTORE_LOG
    return log_format.child_log_env(config.log_level, config.log_format, log_file(config, file_name))


def configure_router_logging(level: str, format_name: str = "text") -> None:
    """The router's stderr: its own records formatted with role `router`, and its children's
    log lines (`child_process.output_logger`) as the child wrote them, so each line has one timestamp
    and the child's role; they stay out of router.log, since each child writes its own file."""
    log_format.configure_logging(level, "router", format_name)
    passthrough = logging.StreamHandler(sys.stderr)
    passthrough.setFormatter(log_format.OneLineFormatter("%(message)s"))  # escapes a stray control char
    output_logger.handlers = [passthrough]
    output_logger.propagate = False


def open_router_log(config: RouterConfig) -> None:
    """Start writing router.log, once the home is ours (another router on it would rotate
    the same file). A new directory is private (0700); raises OSError when the file cannot
    be written."""
    target = log_file(config, ROUTER_LOG)
    if target is None:
        return
    target.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    log_format.add_log_file("router", config.log_format, target)
    quiet = os.environ.get(log_format.STDERR_LEVEL_ENV, "").upper()
    if quiet in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        for handler in [*logging.getLogger().handlers, *output_logger.handlers]:
            if type(handler) is logging.StreamHandler:  # stderr, not the files
                handler.setLevel(quiet)
        logger.info("stderr gets %s and above from now on ($%s); everything is in the files",
                    quiet.lower(), log_format.STDERR_LEVEL_ENV)
    logger.info("log files in %s (read them with `mlxd logs`)", target.path.parent)
