"""A log file as records: a record is one log line, and in text format the traceback lines
under it; read whole from the end (`tail`, reaching into rotated files), merged across
files in time order, or followed as it grows (`FileFollower`, also across a rotation).
"""

from __future__ import annotations

import os
import re
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from protocol.log_format import parse_line

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
