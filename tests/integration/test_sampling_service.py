"""Sampling settings through the real service (router, worker, SmolLM2) and the openai
SDK: top_p keeps what it should, and the penalties move the answer exactly as the
reference formula says (tests/worker/numpy_sampling.py for the unit-level reference)."""

from __future__ import annotations

import math
from pathlib import Path

import openai
import pytest
from tokenizers import Tokenizer

pytestmark = pytest.mark.timeout(600)

POEM = [{"role": "user", "content": "Write a short poem about the sea."}]
REPEAT = [{"role": "user", "content": "List ten fruits, one per line."}]  # greedy: "Apple" again and again
SEEDS = range(8)


@pytest.fixture(scope="module")
def client(service) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{service.base_url}/v1", api_key="x", max_retries=0, timeout=300)


def chat(client: openai.OpenAI, model_id: str, messages: list[dict], **kwargs):
    return client.chat.completions.create(model=model_id, messages=messages, **kwargs).choices[0]


def test_a_top_p_that_keeps_one_token_is_greedy_for_every_seed(client, model_id) -> None:
    greedy = chat(client, model_id, POEM, temperature=0, max_tokens=24).message.content
    for seed in SEEDS:
        narrow = chat(client, model_id, POEM, temperature=1.0, top_p=1e-6, seed=seed, max_tokens=24)
        assert narrow.message.content == greedy, seed
    wide = {chat(client, model_id, POEM, temperature=1.0, top_p=1.0, seed=seed, max_tokens=24).message.content
            for seed in SEEDS}
    assert wide - {greedy}, "top_p=1 at temperature 1 drew the greedy answer for every seed"


def test_every_token_drawn_under_top_p_is_in_its_kept_set(client, model_id) -> None:
    """top_p 0.5 at temperature 1.5: each drawn token's strictly more likely alternatives
    (in the reported distribution, the one before the filter) hold less than half the
    mass; without top_p, the same seeds draw tokens that hold more above them."""

    def mass_above(top_p: float) -> list[float]:
        masses = []
        for seed in SEEDS:
            choice = chat(client, model_id, POEM, temperature=1.5, top_p=top_p, seed=seed, max_tokens=24,
                          logprobs=True, top_logprobs=20)
            masses += [sum(math.exp(alt.logprob) for alt in step.top_logprobs if alt.logprob > step.logprob)
                       for step in choice.logprobs.content]
        return masses

    assert max(mass_above(0.5)) < 0.5
    assert max(mass_above(1.0)) >= 0.5, "without top_p nothing fell outside its set: the test would prove nothing"


def penalized_argmax(step, counts: dict[str, int], presence: float, frequency: float) -> str | None:
    """The token the reference picks greedily from one unpenalized step's top 20 (logit -
    frequency * c - presence * [c > 0], c counted over the answer so far), or None if a
    token outside the top 20 could beat it."""
    scores = {alt.token: alt.logprob - frequency * counts.get(alt.token, 0)
              - presence * (counts.get(alt.token, 0) > 0) for alt in step.top_logprobs}
    best = max(scores, key=scores.get)
    if scores[best] < step.top_logprobs[-1].logprob:
        return None
    runner_up = sorted(scores.values())[-2]
    assert scores[best] - runner_up > 1e-3, "a near tie: the reference cannot tell"
    return best


@pytest.mark.parametrize("presence,frequency", [(0.0, 2.0), (2.0, 0.0), (1.0, 1.0)])
def test_a_penalty_changes_a_repeating_greedy_answer_where_the_reference_says(
        client, model_id, presence: float, frequency: float) -> None:
    """Unpenalized greedy with its top 20 at each step, then penalized greedy: they agree
    up to the first step where the reference (the unpenalized logprobs, penalized by the
    answer's own counts, the prompt's not) picks another token, and
    there the penalized answer takes the reference's token."""
    free = chat(client, model_id, REPEAT, temperature=0, max_tokens=30, logprobs=True, top_logprobs=20)
    steps = free.logprobs.content
    tokens = [s.token for s in steps]
    assert len(tokens) - len(set(tokens)) >= 5, f"the greedy answer barely repeats: {free.message.content!r}"
    penalized = chat(client, model_id, REPEAT, temperature=0, max_tokens=30, presence_penalty=presence,
                     frequency_penalty=frequency, logprobs=True, top_logprobs=20)
    got = [s.token for s in penalized.logprobs.content]
    assert got != tokens, "the penalty changed nothing"
    counts: dict[str, int] = {}
    for position, step in enumerate(steps):
        want = penalized_argmax(step, counts, presence, frequency)
        assert want is not None, f"step {position}: the penalized pick is outside the top 20"
        assert got[position] == want, (position, got[: position + 1], want)
        if want != step.token:
            break  # the answers part here; past this the contexts differ
        counts[step.token] = counts.get(step.token, 0) + 1
    else:
        pytest.fail("the reference never departs from the greedy answer, yet the service did")


def test_a_repetition_penalty_holds_over_the_whole_answer(client, model_id, default_model_dir: Path) -> None:
    """logit_bias +100 on 30 ordinary tokens: unpenalized greedy repeats a few of them;
    with repetition_penalty 10 (each used one's ~100+ logit divided by 10) the first 30
    tokens are the 30, each once. A penalty that looked at the last 20 tokens only would
    let the first ones back from the 21st on."""
    tokenizer = Tokenizer.from_file(str(default_model_dir / "tokenizer.json"))
    steered = list(range(3000, 3030))  # " Pre", " sustain", "word", ...: none is in the prompt
    assert not set(steered) & set(tokenizer.encode(POEM[0]["content"]).ids)
    bias = {str(t): 100 for t in steered}
    free = chat(client, model_id, POEM, temperature=0, max_tokens=30, logit_bias=bias, logprobs=True)
    free_tokens = [s.token for s in free.logprobs.content]
    assert len(free_tokens) == 30 and len(set(free_tokens)) < 30, free_tokens
    assert set(free_tokens) <= {tokenizer.decode([t]) for t in steered}, free_tokens
    penalized = chat(client, model_id, POEM, temperature=0, max_tokens=30, logit_bias=bias, extra_body={"repetition_penalty": 10},
                     logprobs=True)
    got = [s.token for s in penalized.logprobs.content]
    assert len(got) == 30 and len(set(got)) == 30, [t for i, t in enumerate(got) if t in got[:i]]
