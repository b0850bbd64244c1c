"""Speculative sampling keeps the distribution: a row drawn at temperature > 0 whose drafts
are judged by the rejection rule emits tokens distributed exactly as plain sampling would
(chi-square over many seeded draws, against the known distributions), and a rule that
keeps drafts too eagerly is caught by the same check."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from protocol.messages import SamplingParams
from worker import speculative_batch
from worker.sampling import RequestSampler

# per position, the distribution (over 4 tokens) after the row's input at that position;
# the drafts [2, 0, 3]: the first is likely, the second not, the third very
P = np.array([[0.1, 0.2, 0.6, 0.1], [0.15, 0.25, 0.25, 0.35], [0.05, 0.05, 0.1, 0.8], [0.4, 0.3, 0.2, 0.1]])
DRAFTS = [2, 0, 3]
DRAWS = 6000
CHI2_999 = 16.27  # chi-square, 3 degrees of freedom, p = 0.001


def _chi2(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = counts.sum() * probs
    return float(((counts - expected) ** 2 / expected).sum())


def _emitted(judge) -> tuple[np.ndarray, np.ndarray]:
    """Counts of the first emitted token, and of the second given that the first was the
    first draft (then the second draft was judged at position 1)."""
    logprobs = mx.log(mx.array(P, dtype=mx.float32))
    first, second = np.zeros(4), np.zeros(4)
    for seed in range(DRAWS):
        sampler = RequestSampler(SamplingParams(temperature=1.0, seed=seed), 4)
        kept, drawn = judge(sampler, logprobs, DRAFTS)
        tokens = DRAFTS[:kept] + [int(drawn.item())]
        first[tokens[0]] += 1
        if tokens[0] == DRAFTS[0]:
            second[tokens[1]] += 1
    return first, second


def test_the_rejection_rule_emits_the_plain_distribution() -> None:
    first, second = _emitted(speculative_batch.judge_sampled)
    assert _chi2(first, P[0]) < CHI2_999
    assert _chi2(second, P[1]) < CHI2_999
    assert 0 < second.sum() < DRAWS  # both the kept and the refused paths ran


def test_keeping_drafts_too_eagerly_fails_the_same_check() -> None:
    def eager(sampler, logprobs, proposal):  # keeps a draft whenever it is at all possible
        kept, drawn = speculative_batch.judge_sampled(sampler, logprobs, proposal)
        if kept == 0 and mx.exp(logprobs[0, proposal[0]]).item() > 0.05:
            return 1, mx.array([proposal[1]], dtype=mx.uint32)
        return kept, drawn

    first, _ = _emitted(eager)
    assert _chi2(first, P[0]) > CHI2_999
