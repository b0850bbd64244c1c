"""worker/penalties.py (and logit_bias, through make_request_processors) against the numpy
reference: each penalty moves exactly the scores it should and no other, counted over
the whole answer however long, called step by step as the batch calls it."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from protocol.messages import SamplingParams
from tests.worker import numpy_sampling as ref
from worker.penalties import Penalties
from worker.sampling import make_request_processors

VOCAB = 16
# both signs, so the repetition penalty's sign-awareness shows (token 5 sits at exactly 0)
LOGITS = np.array([1.5, -0.5, 2.0, -1.25, 0.75, 0.0, -2.0, 3.0, -0.25, 0.5, 1.0, -1.5, 2.5, -3.0, 0.25, -0.75])
PROMPT = [1, 2, 2, 5, 9]
ANSWER = [3, 4, 4, 4, 2, 12]  # 4 three times; 2 in both; 1, 5 and 9 in the prompt only


def run(processors: list, context: list[int], logits: np.ndarray = LOGITS) -> np.ndarray:
    out = mx.array(logits.astype(np.float32))[None]
    for processor in processors:
        out = processor(mx.array(context, dtype=mx.int32), out)
    return np.array(out.astype(mx.float32))[0]


def moved(after: np.ndarray, before: np.ndarray = LOGITS) -> list[int]:
    return np.flatnonzero(~np.isclose(after, before, rtol=0, atol=1e-6)).tolist()


def processors_for(**sampling: object) -> list:
    return make_request_processors(SamplingParams(**sampling), len(PROMPT))


@pytest.mark.parametrize("sampling,expected_moved", [
    ({"frequency_penalty": 0.5}, [2, 3, 4, 12]),  # the answer's tokens only, not the prompt's
    ({"presence_penalty": 0.7}, [2, 3, 4, 12]),
    ({"frequency_penalty": -0.5}, [2, 3, 4, 12]),  # a negative penalty encourages repeats
    ({"repetition_penalty": 1.3}, [1, 2, 3, 4, 9, 12]),  # prompt and answer; token 5's 0 stays 0
    ({"repetition_penalty": 0.8}, [1, 2, 3, 4, 9, 12]),
    ({"logit_bias": {7: -100.0, 13: 4.0}}, [7, 13]),
    ({"logit_bias": {1: 3.0}, "repetition_penalty": 2.0, "presence_penalty": 0.25, "frequency_penalty": 0.5},
     [1, 2, 3, 4, 9, 12]),
])
def test_each_penalty_moves_exactly_the_scores_it_should(sampling: dict, expected_moved: list[int]) -> None:
    got = run(processors_for(**sampling), PROMPT + ANSWER)
    want = ref.penalized(LOGITS, PROMPT, ANSWER, repetition=sampling.get("repetition_penalty", 1.0),
                         presence=sampling.get("presence_penalty", 0.0),
                         frequency=sampling.get("frequency_penalty", 0.0), logit_bias=sampling.get("logit_bias"))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert moved(got) == expected_moved


def test_the_amounts_frequency_presence_and_repetition_move() -> None:
    """The formula spelled out on a few tokens (the reference's own check)."""
    freq = run(processors_for(frequency_penalty=0.5), PROMPT + ANSWER)
    assert freq[4] == pytest.approx(LOGITS[4] - 1.5) and freq[3] == pytest.approx(LOGITS[3] - 0.5)
    pres = run(processors_for(presence_penalty=0.5), PROMPT + ANSWER)
    assert pres[4] == pytest.approx(LOGITS[4] - 0.5) and pres[3] == pytest.approx(LOGITS[3] - 0.5)
    rep = run(processors_for(repetition_penalty=2.0), PROMPT + ANSWER)
    assert rep[2] == pytest.approx(1.0) and rep[1] == pytest.approx(-1.0)  # 2.0 / 2 and -0.5 * 2
    # logit_bias comes first: token 1's -0.5 biased to +2.5 is then divided, not multiplied
    both = run(processors_for(logit_bias={1: 3.0}, repetition_penalty=2.0), PROMPT + ANSWER)
    assert both[1] == pytest.approx(1.25)


def test_no_penalty_is_no_processor() -> None:
    assert processors_for() == []
    assert processors_for(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0) == []
    assert len(processors_for(presence_penalty=0.1)) == 1


def test_a_token_sampled_long_ago_stays_penalized() -> None:
    """Called step by step over a 300-token answer, as the batch calls it: at every step the
    scores equal the reference over everything sampled so far (mlx-lm's processors forget
    a token 20 tokens after it was sampled)."""
    rng = np.random.default_rng(3)
    vocab = 400
    logits = rng.normal(0.0, 2.0, size=vocab)
    prompt = rng.integers(0, vocab, size=50).tolist()
    answer = [7] + rng.integers(8, vocab, size=299).tolist()  # token 7 once, at the start
    processors = make_request_processors(SamplingParams(repetition_penalty=1.2, presence_penalty=0.4,
                                                        frequency_penalty=0.3), len(prompt))
    for step in range(len(answer) + 1):
        got = run(processors, prompt + answer[:step], logits)
        if step % 37 == 0 or step == len(answer):
            want = ref.penalized(logits, prompt, answer[:step], repetition=1.2, presence=0.4, frequency=0.3)
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
    assert got[7] < logits[7] - 0.7  # still penalized 299 tokens later


def test_each_processor_sees_its_own_prompt_length() -> None:
    """The same context split differently: what is prompt is only repetition-penalized."""
    context = [3, 3, 4]
    as_prompt = run([Penalties(3, presence=1.0)], context)
    as_answer = run([Penalties(0, presence=1.0)], context)
    assert moved(as_prompt) == [] and moved(as_answer) == [3, 4]


def test_a_shorter_context_is_recounted() -> None:
    penalties = Penalties(2, frequency=1.0)
    run([penalties], [1, 2, 5, 5, 5])
    again = run([penalties], [1, 2, 6])  # never happens in the batch; counted from scratch if it does
    np.testing.assert_allclose(again, ref.penalized(LOGITS, [1, 2], [6], frequency=1.0), atol=1e-6)


def test_a_repeated_call_with_the_same_context_counts_nothing_twice() -> None:
    penalties = Penalties(1, frequency=1.0)
    first = run([penalties], [1, 4, 4])
    second = run([penalties], [1, 4, 4])
    np.testing.assert_array_equal(first, second)
    assert np.array(penalties.answer_counts)[4] == 2
