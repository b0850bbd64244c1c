"""The planner widens a step only where the expected tokens outrun the positions' cost:
a row copying its input at batch 1 goes wide, free text and a lone copier among eight
rows stay plain, and the cost line follows the measured steps."""

from __future__ import annotations

import pytest

from worker.draft_planner import Acceptance, StepCost, best_width, expected_tokens


def test_expected_tokens_count_each_draft_kept_while_all_before_it_were() -> None:
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_a_copying_row_alone_goes_wide_and_free_text_stays_plain() -> None:
    cost = StepCost()  # the 0.5B's measured shape: 26 ms + 7.3 ms a position
    assert best_width([(16, 0.95)], cost) >= 8
    assert best_width([(16, 0.1)], cost) == 1
    assert best_width([(0, 0.0)], cost) == 1


def test_one_copier_among_eight_rows_does_not_pay_for_the_others_positions() -> None:
    cost = StepCost()
    assert best_width([(16, 0.95)] + [(0, 0.0)] * 7, cost) <= 2
    assert best_width([(16, 0.95)] * 8, cost) > 1  # all eight copying: it pays again


def test_the_cost_line_follows_measured_steps_and_stays_sane() -> None:
    cost = StepCost(decay=0.5)
    for _ in range(30):  # a machine where positions are nearly free (a GPU)
        for positions in (1, 8, 16):
            cost.record(positions, 0.050 + 0.0005 * positions)
    fixed, slope = cost.line()
    assert fixed == pytest.approx(0.050, rel=0.05) and slope == pytest.approx(0.0005, rel=0.1)
    assert best_width([(16, 0.5)], cost) > 2  # cheap positions: wide even at middling acceptance
    noisy = StepCost(decay=0.5)
    for _ in range(10):
        noisy.record(1, 0.100)
        noisy.record(2, 0.010)  # a line that would fall: clamped
    fixed, slope = noisy.line()
    assert fixed > 0 and 0 < slope <= fixed


def test_acceptance_forgets_old_runs() -> None:
    acceptance = Acceptance()
    assert acceptance.p == pytest.approx(0.8)
    for _ in range(5):
        acceptance.record(8, 0)
    assert acceptance.p < 0.2
    for _ in range(5):
        acceptance.record(8, 8)
    assert acceptance.p > 0.8
