"""Logprobs from the engine (worker/logprobs.py) equal a log-softmax computed here from the
model's own logits, on every path a token is sampled on: the batch, the early first
token, and a prefix hit's one-pass prefill; on a tiny model with the real tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from protocol.messages import (
    AddRequest,
    Constraint,
    SamplingParams,
    TokenEvent,
    TokenLogprobs,
)
from tests.worker.test_prefix_cache import Harness, _prompt_ids, chat
from tests.worker.tiny_models import make_tiny
from worker.vocabulary import TokenVocabulary

TOP = 5
TOLERANCE = 1e-3  # one forward pass over the whole sequence vs the engine's cached steps


@pytest.fixture(scope="module")
def tiny(default_model_dir: Path):
    return make_tiny("llama", default_model_dir)


def run(h: Harness, rid: str, messages: list[dict], constraint: Constraint | None = None,
        max_tokens: int = 8) -> tuple[list[int], list[TokenLogprobs]]:
    h.engine.add(AddRequest(rid, messages=messages, constraint=constraint, sampling=SamplingParams(
        max_tokens=max_tokens, temperature=0.0, logprobs=True, top_logprobs=TOP)))
    h.run()
    events = [e for e in h.events if isinstance(e, TokenEvent) and e.request_id == rid and e.token_ids]
    assert all(e.logprobs is not None and len(e.logprobs.logprobs) == len(e.token_ids) for e in events)
    return [t for e in events for t in e.token_ids], [e.logprobs for e in events]


def reference(tiny, prompt: list[int], generated: list[int]) -> np.ndarray:
    """log-softmax of the model's logits at each generated position, in one pass."""
    logits = tiny.model(mx.array([prompt + generated[:-1]]))[0, len(prompt) - 1:].astype(mx.float32)
    return np.array(logits - mx.logsumexp(logits, axis=-1, keepdims=True))


def check(tiny, messages: list[dict], ids: list[int], figures: list[TokenLogprobs]) -> None:
    vocabulary = TokenVocabulary(tiny.tokenizer, tiny.config["vocab_size"], sorted(tiny.tokenizer.eos_token_ids))
    expected = reference(tiny, _prompt_ids(tiny.tokenizer, messages), ids)
    for position, (token, got) in enumerate(zip(ids, figures)):
        row = expected[position]
        assert got.token_bytes == [vocabulary.token_bytes(token)]
        assert abs(got.logprobs[0] - row[token]) < TOLERANCE
        best = np.argsort(-row)[:TOP]
        assert got.top_bytes[0] == [vocabulary.token_bytes(int(t)) for t in best]
        assert np.allclose(got.top_logprobs[0], row[best], atol=TOLERANCE)
        assert got.top_bytes[0][0] == got.token_bytes[0]  # greedy: the top token is the one sent


@pytest.mark.parametrize("early_first_token", [True, False])
def test_logprobs_match_a_log_softmax_of_the_logits(tiny, early_first_token: bool) -> None:
    h = Harness(tiny, cache=False)
    h.engine._early_first_token.enabled = early_first_token
    messages = chat("What is topic 2?")
    ids, figures = run(h, "r", messages)
    assert len(ids) == 8
    check(tiny, messages, ids, figures)


def test_logprobs_of_a_prefix_hit_first_token(tiny) -> None:
    h = Harness(tiny)
    messages = chat("What is topic 6?")
    run(h, "warm", messages, max_tokens=2)
    ids, figures = run(h, "hit", messages)
    finish = h.result("hit")[1]
    assert finish.usage.cached_tokens > 0
    check(tiny, messages, ids, figures)


def test_a_grammar_leaves_only_allowed_alternatives(tiny) -> None:
    h = Harness(tiny, cache=False)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    _, figures = run(h, "c", chat("JSON please"), Constraint("json_schema", json.dumps(schema)), max_tokens=20)
    first = figures[0]
    assert first.logprobs == [0.0] and first.top_bytes[0] == first.token_bytes  # '{"' is forced
    text = b"".join(f.token_bytes[0] for f in figures).decode()
    assert text in ('{"ok": true}', '{"ok": false}')
