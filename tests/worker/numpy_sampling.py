"""A reference for mlxd's sampling written in numpy (float64), independent of MLX and
mlx-lm: which tokens top_p / min_p / top_k keep, what the penalties do to the logits, the
distribution a draw follows, and a chi-square test to compare draws with it."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def log_softmax(logits: np.ndarray) -> np.ndarray:
    logits = np.asarray(logits, dtype=np.float64)
    shifted = logits - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


def kept(logits: np.ndarray, top_p: float = 1.0, min_p: float = 0.0, top_k: int = 0) -> np.ndarray:
    """The tokens a draw may return, as a boolean mask (no ties at the k-th for top_k):
    - top_p: kept iff the tokens strictly more likely hold less than top_p of the mass;
    - min_p: kept iff p >= min_p * max(p);
    - top_k: kept iff fewer than top_k tokens are strictly more likely."""
    probs = np.exp(log_softmax(logits))
    more_likely = probs[None, :] > probs[:, None]  # [i, j]: j is strictly more likely than i
    mask = np.ones(probs.shape, dtype=bool)
    if 0.0 < top_p < 1.0:
        mask &= (more_likely * probs[None, :]).sum(axis=1) < top_p
    if min_p > 0.0:
        mask &= probs >= min_p * probs.max()
    if top_k > 0:
        mask &= more_likely.sum(axis=1) < top_k
    return mask


def draw_distribution(logits: np.ndarray, temperature: float, **filters: float) -> np.ndarray:
    """The probability of each token in one draw: the kept tokens' log-probabilities (at
    temperature 1) divided by the temperature, renormalized; 0 for the others."""
    mask = kept(logits, **filters)
    scaled = np.where(mask, log_softmax(logits) / temperature, -np.inf)
    return np.exp(log_softmax(scaled))


def penalized(logits: np.ndarray, prompt: Sequence[int], answer: Sequence[int], repetition: float = 1.0,
              presence: float = 0.0, frequency: float = 0.0,
              logit_bias: dict[int, float] | None = None) -> np.ndarray:
    """The logits after logit_bias, then the repetition penalty (sign-aware, over prompt and
    answer), then frequency and presence (over the answer's tokens only, OpenAI's formula)."""
    out = np.array(logits, dtype=np.float64)
    for token, bias in (logit_bias or {}).items():
        out[token] += bias
    seen = set(prompt) | set(answer)
    for token in seen:
        out[token] = out[token] / repetition if out[token] > 0 else out[token] * repetition
    counts = np.bincount(np.asarray(answer, dtype=np.int64), minlength=out.shape[0]).astype(np.float64)
    return out - frequency * counts - presence * (counts > 0)


def _upper_gamma_regularized(a: float, x: float) -> float:
    """Q(a, x) = Gamma(a, x) / Gamma(a) (Numerical Recipes' gammq: series below a + 1,
    continued fraction above)."""
    if x <= 0.0:
        return 1.0
    log_front = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1.0:
        term = total = 1.0 / a
        n = a
        while abs(term) > abs(total) * 1e-15:
            n += 1.0
            term *= x / n
            total += term
        return 1.0 - total * math.exp(log_front)
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return math.exp(log_front) * h


def chi_square_p_value(statistic: float, degrees_of_freedom: int) -> float:
    """P(X >= statistic) for X chi-square distributed with `degrees_of_freedom`."""
    return _upper_gamma_regularized(degrees_of_freedom / 2.0, statistic / 2.0)


def goodness_of_fit(samples: np.ndarray, expected: np.ndarray) -> float:
    """The chi-square p-value of `samples` (token ids) against the distribution `expected`,
    over the tokens it gives a nonzero probability (a sample outside them is the caller's
    to refuse: here it would only be dropped). The least likely tokens share one bin, as
    few as leave every bin an expected count of at least 5."""
    support = np.flatnonzero(expected > 0)
    support = support[np.argsort(expected[support])]
    counts = np.bincount(samples, minlength=expected.shape[0])[support].astype(np.float64)
    want = expected[support] * len(samples)
    pooled = int(np.searchsorted(np.cumsum(want), 5.0)) + 1 if want[0] < 5 else 0
    if pooled:
        counts = np.concatenate([[counts[:pooled].sum()], counts[pooled:]])
        want = np.concatenate([[want[:pooled].sum()], want[pooled:]])
    assert len(want) >= 2 and want.min() >= 5, "too few draws for a chi-square test"
    statistic = float(((counts - want) ** 2 / want).sum())
    return chi_square_p_value(statistic, len(want) - 1)
