"""`mlxd logs`: the last lines of the service's log files (router.log, kvstore.log,
worker-MODEL.log under log_dir) merged in time order, and with `-f` the new ones as they
come, also across a rotation. Reads the files only: no running service is needed.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from protocol.log_format import parse_line
from router.config import RouterConfig
from router.log_files import (
    KVSTORE_LOG,
    ROUTER_LOG,
    WORKER_LOG_PREFIX,
    log_dir,
    worker_log_name,
    worker_model,
)

ROLES = ("router", "worker", "kvstore")
FOLLOW_POLL_S = 0.2
# a line that starts a record (text: its date; json: every line); a text record's traceback
# lines follow it without one and belong to it. Cheaper than parsing every line's time.
_RECORD_START = re.compile(r"\{|\d{4}-\d\d-\d\d ")
_EARLIEST = datetime.min.replace(tzinfo=UTC)


@dataclass
class Entry:
    """One record as it stands in a file: its line, and in text format the traceback lines
    under it. `time` is None until `timed` reads it from the first line."""

    lines: list[str]
    time: datetime | None = None

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def records(lines: Iterable[str]) -> Iterator[Entry]:
    """`lines` (newlines stripped) grouped into records; lines before the first record (a
    file that does not start with one) make a record of their own."""
    current: Entry | None = None
    for line in lines:
        if current is not None and not _RECORD_START.match(line):
            current.lines.append(line)
            continue
        if current is not None:
            yield current
        current = Entry([line])
    if current is not None:
        yield current


def timed(entries: list[Entry], after: datetime = _EARLIEST) -> list[Entry]:
    """`entries` with their times read; one whose first line has none (not a log line) takes
    the time of the record before it, so it stays in its place when files are merged."""
    for entry in entries:
        head = parse_line(entry.lines[0])
        entry.time = after = head.time if head is not None else after
    return entries


def _read_lines(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8", errors="replace", newline="\n") as f:  # a line ends at \n only
        for line in f:
            yield line.rstrip("\n")


def backups(path: Path) -> Iterator[Path]:
    """`path`'s rotated files, newest first (`.1`, `.2` …), while they exist."""
    index = 1
    while (older := path.with_name(f"{path.name}.{index}")).exists():
        yield older
        index += 1


def tail(path: Path, num_records: int, current: Iterable[str] | None = None) -> list[Entry]:
    """The last `num_records` records of `path` (whose lines are `current` when the caller
    read them already), reaching into its rotated files when it holds fewer (a rotation
    never splits a record: each is written whole)."""
    if num_records <= 0:
        return []
    kept = list(deque(records(_read_lines(path) if current is None else current), maxlen=num_records))
    for source in backups(path):
        if len(kept) >= num_records:
            break
        try:
            kept = list(deque(records(_read_lines(source)), maxlen=num_records - len(kept))) + kept
        except FileNotFoundError:  # rotated away while we read: its lines are in the next one
            continue
    return timed(kept)


def merge(per_file: Sequence[list[Entry]], num_records: int) -> list[Entry]:
    """The last `num_records` records of all files, oldest first (a stable sort: records of
    one time keep their file's order)."""
    merged = sorted((entry for entries in per_file for entry in entries),
                    key=lambda entry: entry.time or _EARLIEST)
    return merged[-num_records:] if num_records > 0 else []


def log_files(directory: Path, roles: Sequence[str], model: str | None) -> list[Path]:
    """The current log files of `roles` in `directory` (backups are found from them); with
    `model`, the worker file is that model's only. Files that do not exist are left out."""
    found: list[Path] = []
    if "router" in roles:
        found.append(directory / ROUTER_LOG)
    if "kvstore" in roles:
        found.append(directory / KVSTORE_LOG)
    if "worker" in roles:
        if model is not None:
            found.append(directory / worker_log_name(model))
        else:
            found += sorted(directory.glob(f"{WORKER_LOG_PREFIX}*.log"))
    return [path for path in found if path.is_file()]


def logged_models(directory: Path) -> list[str]:
    """The models with a worker log file in `directory`."""
    return sorted(name for path in directory.glob(f"{WORKER_LOG_PREFIX}*.log")
                  if (name := worker_model(path.name)) is not None)


class FileFollower:
    """Reads one log file from its start, then what is appended, also across a rotation:
    when the path names another file (the old one was renamed to `.1`) or a shorter one
    (truncated), the rest of the old file is read first, then the new one from its start."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file: IO[bytes] | None = None
        self.inode: int | None = None
        self.partial = b""  # a line still being written
        self.last_time = _EARLIEST  # of the last record read, for lines without one
        self._open()

    def _open(self) -> bool:
        try:
            self.file = self.path.open("rb")
        except FileNotFoundError:
            return False
        self.inode = os.fstat(self.file.fileno()).st_ino
        return True

    def read_lines(self) -> list[str]:
        """The complete lines written since the last call."""
        if self.file is None and not self._open():
            return []
        assert self.file is not None
        data = self.file.read()
        try:
            now = os.stat(self.path)
        except FileNotFoundError:  # between the rename and the new file
            now = None
        if now is None or now.st_ino != self.inode:
            data += self.file.read()  # written to the old file before it was renamed
            self.file.close()
            self.file = None
            if (self.partial + data) and not (self.partial + data).endswith(b"\n"):
                data += b"\n"  # the old file's last line ends with it
            if now is not None and self._open():
                data += self.file.read()
        elif now.st_size < self.file.tell():
            self.file.seek(0)
            data += self.file.read()
        *complete, self.partial = (self.partial + data).split(b"\n")
        return [line.decode("utf-8", errors="replace") for line in complete if line]

    def read_records(self) -> list[Entry]:
        entries = timed(list(records(self.read_lines())), self.last_time)
        if entries:
            self.last_time = entries[-1].time or self.last_time
        return entries

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def follow(directory: Path, roles: Sequence[str], model: str | None, followers: dict[Path, FileFollower],
           poll_s: float = FOLLOW_POLL_S) -> None:
    """Print new records of the chosen files as they are written, each poll's merged in time
    order, until interrupted; files that appear later (a model loaded since) are read from
    their start and join `followers`."""
    while True:
        for path in log_files(directory, roles, model):
            if path not in followers:
                followers[path] = FileFollower(path)
        batch = merge([follower.read_records() for follower in followers.values()], sys.maxsize)
        for entry in batch:
            sys.stdout.write(entry.text + "\n")
        if batch:
            sys.stdout.flush()
        time.sleep(poll_s)


def logs_command(config: RouterConfig, roles: Sequence[str] | None, model: str | None, num_lines: int,
                 keep_following: bool) -> int:
    """`mlxd logs`: the last `num_lines` records of the chosen roles' files, merged in time
    order (a text record's traceback lines come with it), then with `keep_following` the new
    ones until Ctrl-C."""
    directory = log_dir(config)
    chosen = tuple(roles) if roles else (("worker",) if model is not None else ROLES)
    if model is not None and "worker" not in chosen:
        print("mlxd logs: --model picks a worker's log; add --role worker", file=sys.stderr)
        return 2
    if num_lines < 0:
        print(f"mlxd logs: -n must be >= 0, got {num_lines}", file=sys.stderr)
        return 2
    files = log_files(directory, chosen, model)
    if model is not None and not (directory / worker_log_name(model)).is_file() and not keep_following:
        models = ", ".join(logged_models(directory)) or "none"
        print(f"mlxd logs: no log file for model {model!r} in {directory} (models with logs: {models})",
              file=sys.stderr)
        return 1
    if not files and not keep_following:
        print(f"mlxd logs: no log files in {directory}: the service writes them once it has run with this "
              "home (see --log-dir, --log-files)", file=sys.stderr)
        return 1
    # each file is read through the handle that then follows it: no line is lost or
    # printed twice between the last lines and the new ones
    followers = {path: FileFollower(path) for path in files}
    try:
        newest = []
        for path, follower in followers.items():
            entries = tail(path, num_lines, follower.read_lines())
            if entries and entries[-1].time is not None:
                follower.last_time = entries[-1].time  # the time of traceback lines that come next
            newest.append(entries)
        for entry in merge(newest, num_lines):
            sys.stdout.write(entry.text + "\n")
        sys.stdout.flush()
        if keep_following:
            follow(directory, chosen, model, followers)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `mlxd logs | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
    finally:
        for follower in followers.values():
            follower.close()
    return 0
