"""worker/sampling.py against the numpy reference (tests/worker/numpy_sampling.py), on
fixed logits: which tokens top_p / min_p / top_k keep, boundaries included, and that
seeded draws follow the reference's distribution and never leave the kept set.

The chi-square checks refuse a fit at p < 1e-4: with the seeds fixed they are
deterministic, and a correct sampler would fail one by chance once in 10,000 seeds."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

from protocol.messages import SamplingParams
from tests.worker import numpy_sampling as ref
from worker.sampling import greedy, keep_likely, make_request_sampler

SIGNIFICANCE = 1e-4
VOCAB = 12
# a fixed distribution with a clear head and a long tail (probabilities ~0.33 ... 0.002)
LOGITS = np.array([2.1, 1.7, 1.2, 1.15, 0.4, 0.0, -0.3, -0.9, -1.5, -2.2, -2.8, -3.5])


def logprobs_of(logits: np.ndarray) -> mx.array:
    """What a sampler is given: normalized log-probabilities, float32, one row per draw."""
    array = mx.array(np.atleast_2d(logits).astype(np.float32))
    return array - mx.logsumexp(array, axis=-1, keepdims=True)


def kept_by_mlxd(logits: np.ndarray, **filters: float) -> np.ndarray:
    params = SamplingParams(temperature=1.0, **filters)
    filtered = keep_likely(logprobs_of(logits), params, np.atleast_2d(logits).shape[-1])
    return np.isfinite(np.array(filtered))


def dyadic(*probs: float) -> np.ndarray:
    """Logits whose float32 log-probabilities exponentiate back to exactly `probs`, so a
    boundary case sits exactly on its boundary (checked, not assumed)."""
    logits = np.log(np.array(probs))
    assert (np.exp(np.array(logprobs_of(logits))[0]) == np.array(probs, dtype=np.float32)).all()
    return logits


def test_the_chi_square_reference_matches_closed_forms() -> None:
    for x in (0.5, 3.0, 10.0, 30.0):
        assert math.isclose(ref.chi_square_p_value(x, 1), math.erfc(math.sqrt(x / 2)), rel_tol=1e-9)
        assert math.isclose(ref.chi_square_p_value(x, 2), math.exp(-x / 2), rel_tol=1e-9)
        assert math.isclose(ref.chi_square_p_value(x, 3), math.erfc(math.sqrt(x / 2))
                            + math.sqrt(2 * x / math.pi) * math.exp(-x / 2), rel_tol=1e-9)
        assert math.isclose(ref.chi_square_p_value(x, 4), math.exp(-x / 2) * (1 + x / 2), rel_tol=1e-9)


# --------------------------------------------------------------- which tokens are kept

def test_top_k_1_is_greedy_for_every_row() -> None:
    logits = np.random.default_rng(0).normal(0.0, 2.0, size=(500, 64))
    for temperature in (0.5, 1.0, 2.0):
        sampler = make_request_sampler(SamplingParams(temperature=temperature, top_k=1, seed=1), 64)
        assert np.array(sampler(logprobs_of(logits))).tolist() == np.array(greedy(logprobs_of(logits))).tolist()
        assert np.array(greedy(logprobs_of(logits))).tolist() == logits.argmax(axis=1).tolist()


@pytest.mark.parametrize("probs,top_p,expected", [
    ((0.5, 0.25, 0.125, 0.125), 0.75, [0, 1]),  # the token reaching top_p exactly is kept, the next is not
    ((0.5, 0.25, 0.125, 0.125), 0.5, [0]),
    ((0.5, 0.25, 0.125, 0.125), 0.76, [0, 1, 2, 3]),  # past 0.75: the tied 0.125s are kept together
    ((0.5, 0.125, 0.125, 0.125, 0.125), 0.6, [0, 1, 2, 3, 4]),  # ties with the last kept token stay
    ((0.5, 0.125, 0.125, 0.125, 0.125), 0.5, [0]),
    ((0.25, 0.25, 0.25, 0.25), 0.1, [0, 1, 2, 3]),  # a tie at the top: all of it
])
def test_top_p_boundaries(probs: tuple[float, ...], top_p: float, expected: list[int]) -> None:
    logits = dyadic(*probs)
    assert np.flatnonzero(ref.kept(logits, top_p=top_p)).tolist() == expected
    assert np.flatnonzero(kept_by_mlxd(logits, top_p=top_p)[0]).tolist() == expected


def test_a_tiny_top_p_keeps_exactly_the_top_token() -> None:
    logits = np.random.default_rng(1).normal(0.0, 3.0, size=(300, 40))
    kept = kept_by_mlxd(logits, top_p=1e-6)
    assert kept.sum(axis=1).tolist() == [1] * 300
    assert kept.argmax(axis=1).tolist() == logits.argmax(axis=1).tolist()


@pytest.mark.parametrize("min_p,expected", [
    (0.25, [0, 1, 2]),  # 0.125 is exactly 0.25 * 0.5: kept
    (0.2500001, [0, 1]),
    (0.125, [0, 1, 2, 3, 4]),  # the tied 0.0625s exactly at the threshold: both kept
    (1.0, [0]),
])
def test_min_p_boundaries(min_p: float, expected: list[int]) -> None:
    logits = dyadic(0.5, 0.25, 0.125, 0.0625, 0.0625)
    assert np.flatnonzero(ref.kept(logits, min_p=min_p)).tolist() == expected
    assert np.flatnonzero(kept_by_mlxd(logits, min_p=min_p)[0]).tolist() == expected


def test_top_k_keeps_exactly_k_and_breaks_a_tie_inside_it() -> None:
    logits = np.array([3.0, 2.0, 1.0, 1.0, 1.0, 0.0])
    kept = np.flatnonzero(kept_by_mlxd(logits, top_k=3)[0]).tolist()
    assert len(kept) == 3 and kept[:2] == [0, 1] and kept[2] in (2, 3, 4)
    assert np.flatnonzero(kept_by_mlxd(logits, top_k=2)[0]).tolist() == [0, 1]


@pytest.mark.parametrize("filters", [
    {"top_p": 0.9}, {"top_p": 0.5}, {"min_p": 0.1}, {"min_p": 0.3}, {"top_k": 5}, {"top_k": 17},
    {"top_p": 0.95, "min_p": 0.05, "top_k": 8}, {"top_p": 0.6, "top_k": 20}, {"min_p": 0.02, "top_k": 3},
])
def test_the_kept_set_is_the_reference_one(filters: dict[str, float]) -> None:
    logits = np.random.default_rng(2).normal(0.0, 2.0, size=(200, 50))
    expected = np.stack([ref.kept(row, **filters) for row in logits])
    assert (kept_by_mlxd(logits, **filters) == expected).all()


# --------------------------------------------------------------- what a draw follows

# each case keeps a set that the temperature, applied before the filters, would change
DRAW_CASES = [
    pytest.param({"temperature": 1.0}, id="no-filter"),
    pytest.param({"temperature": 0.7, "top_p": 0.8}, id="top_p"),
    pytest.param({"temperature": 1.6, "min_p": 0.15}, id="min_p"),
    pytest.param({"temperature": 1.0, "top_k": 4}, id="top_k"),
    pytest.param({"temperature": 1.3, "top_p": 0.9, "min_p": 0.1, "top_k": 6}, id="all-three"),
]


def reference_and_kept(params: dict[str, float]) -> tuple[np.ndarray, set[int]]:
    filters = {k: v for k, v in params.items() if k != "temperature"}
    expected = ref.draw_distribution(LOGITS, params["temperature"], **filters)
    return expected, set(np.flatnonzero(expected).tolist())


@pytest.mark.parametrize("params", DRAW_CASES)
def test_batched_draws_follow_the_reference(params: dict[str, float]) -> None:
    """10,000 rows of the same logits in one call: one draw each, from one seeded key."""
    expected, kept = reference_and_kept(params)
    sampler = make_request_sampler(SamplingParams(seed=20240601, **params), VOCAB)
    rows = mx.broadcast_to(logprobs_of(LOGITS), (10_000, VOCAB))
    samples = np.array(sampler(rows))
    assert set(samples.tolist()) <= kept
    assert ref.goodness_of_fit(samples, expected) > SIGNIFICANCE


@pytest.mark.parametrize("params", DRAW_CASES)
def test_one_request_s_successive_draws_follow_the_reference(params: dict[str, float]) -> None:
    """As a request draws: one token per call, the seeded key advancing each time (a key
    that did not advance would draw one token forever and fail the fit)."""
    expected, kept = reference_and_kept(params)
    sampler = make_request_sampler(SamplingParams(seed=7, **params), VOCAB)
    row = logprobs_of(LOGITS)
    samples = np.array([sampler(row).item() for _ in range(1500)])
    assert set(samples.tolist()) <= kept
    assert ref.goodness_of_fit(samples, expected) > SIGNIFICANCE


def test_the_same_seed_draws_the_same_tokens_and_another_seed_others() -> None:
    def draws(seed: int) -> list[int]:
        sampler = make_request_sampler(SamplingParams(temperature=1.0, top_p=0.95, seed=seed), VOCAB)
        return [sampler(logprobs_of(LOGITS)).item() for _ in range(40)]

    assert draws(5) == draws(5)
    assert draws(5) != draws(6)
    # a 64-bit negative seed is a seed like any other
    assert draws(-(2**63)) == draws(-(2**63))


def test_temperature_zero_is_greedy_whatever_the_filters() -> None:
    sampler = make_request_sampler(SamplingParams(temperature=0.0, top_p=0.1, top_k=3, seed=1), VOCAB)
    assert sampler is greedy
    assert sampler(logprobs_of(LOGITS)).item() == int(LOGITS.argmax())
