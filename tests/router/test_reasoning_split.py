"""The reasoning span splits from the answer however the text is cut into deltas."""

from __future__ import annotations

import pytest

from router.reasoning_split import ANSWER, REASONING, ReasoningMarkers, ReasoningSplitter


def split(text: str, markers: ReasoningMarkers, cuts: int) -> tuple[str, str]:
    """(reasoning, answer) of `text` fed in pieces of `cuts` characters."""
    splitter = ReasoningSplitter(markers)
    pieces = []
    for start in range(0, len(text), cuts):
        pieces += splitter.feed(text[start:start + cuts])
    pieces += splitter.finish()
    return ("".join(t for kind, t in pieces if kind == REASONING), "".join(t for kind, t in pieces if kind == ANSWER))


THINK = ReasoningMarkers()
OPEN = ReasoningMarkers(opens_in_prompt=True)


@pytest.mark.parametrize("cuts", [1, 2, 3, 7, 1000])
@pytest.mark.parametrize(("markers", "text", "reasoning", "answer"), [
    (THINK, "<think>\nWeigh it.</think>\n\nIt is 4.", "Weigh it.", "It is 4."),
    (THINK, "  <think>a < b </th</think>ok", "a < b </th", "ok"),
    (THINK, "No span here. <think>x</think>", "", "No span here. <think>x</think>"),  # only at the start
    (THINK, "<thin", "", "<thin"),  # an answer that only looked like a marker
    (THINK, "<think>never closed", "never closed", ""),  # cut by max_tokens inside the span
    (OPEN, "step one</think>\n\nanswer </think> stays", "step one", "answer </think> stays"),
    (OPEN, "\n</think>\n\nat once", "", "at once"),  # a span closed at once (a budget of 0)
    (OPEN, "", "", ""),
])
def test_the_span_splits_at_any_cut(markers: ReasoningMarkers, text: str, reasoning: str, answer: str,
                                    cuts: int) -> None:
    assert split(text, markers, cuts) == (reasoning, answer)


def test_reasoning_goes_out_as_it_streams_holding_back_only_a_possible_marker() -> None:
    splitter = ReasoningSplitter(OPEN)
    assert splitter.feed("thinking </") == [(REASONING, "thinking ")]
    assert splitter.feed("think>Hi") == [(ANSWER, "Hi")]


def test_the_first_reasoning_after_the_opener_goes_out_at_once() -> None:
    splitter = ReasoningSplitter(THINK)
    assert splitter.feed("<think>") == []
    assert splitter.feed("\nab") == [(REASONING, "ab")]
