"""A stop string never reaches the client, even split across tokens."""

from __future__ import annotations

import pytest

from worker.stop_strings import StopStringFilter


def run(stops: list[str], deltas: list[str]) -> tuple[str, bool]:
    f = StopStringFilter(stops)
    out = ""
    for d in deltas:
        out += f.push(d)
        if f.stopped:
            return out, True
    return out + f.flush(), False


@pytest.mark.parametrize(
    "stops, deltas, expected, stopped",
    [
        ([], ["a", "b"], "ab", False),
        (["Paris"], ["The capital is ", "Par", "is."], "The capital is ", True),
        (["Paris"], ["The capital is P", "a", "r", "i", "s"], "The capital is ", True),
        (["Paris"], ["Par", "k"], "Park", False),
        (["\n\n"], ["line\n", "\nnext"], "line", True),
        (["END", "STOP"], ["go ST", "OP now"], "go ", True),
        (["abc"], ["xab"], "xab", False),  # held 'ab' is released at the end
        (["aab"], ["a", "a", "a", "b"], "a", True),
        (["x"], ["x"], "", True),
    ],
)
def test_stop_filter(stops, deltas, expected, stopped) -> None:
    assert run(stops, deltas) == (expected, stopped)


def test_held_text_is_not_sent_early() -> None:
    f = StopStringFilter(["Paris"])
    assert f.push("It is Pa") == "It is "
    assert f.push("ella") == "Paella"
