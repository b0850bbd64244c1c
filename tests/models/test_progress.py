"""Progress lines: one redrawn bar per stage on a terminal, a line per tenth elsewhere."""

from __future__ import annotations

import io

from models.progress import ProgressPrinter


def test_plain_lines_at_each_tenth() -> None:
    out = io.StringIO()
    printer = ProgressPrinter(out, tty=False)
    for done in range(0, 1001, 7):
        printer("convert", done, 1000)
    printer("convert", 1000, 1000)
    lines = out.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == [f"{p}%" for p in range(0, 101, 10)]
    assert lines[-1] == "convert 100% (1000/1000 tensors)"


def test_terminal_bar_is_redrawn_in_place_and_ends_its_line() -> None:
    out = io.StringIO()
    printer = ProgressPrinter(out, tty=True)
    for done in range(7):
        printer("download", done, 6)
    printer("assemble", 491_400_064, 491_400_064)
    text = out.getvalue()
    assert text.count("\n") == 2  # one finished line per stage
    assert text.count("\r") == 8
    first, second = text.split("\n")[:2]
    assert first.rsplit("\r", 1)[-1].startswith("download")
    assert "100% 6/6 wheels" in first
    assert "concatenate+sha256" in second and "491/491 MB" in second
