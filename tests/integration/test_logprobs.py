"""logprobs on the real default model through the real service and the openai SDK, chat and
completions, streamed and not: each figure equals a log-softmax this test computes from
the model's own logits (the model loaded here with mlx-lm, on the same prompt tokens),
and the top alternative is the greedy token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import openai
import pytest
from mlx_lm.models.cache import make_prompt_cache

from worker.model_loader import LoadedModel, load_for_serving
from worker.vocabulary import TokenVocabulary

pytestmark = pytest.mark.timeout(600)

NUM_TOKENS = 6
TOP = 3
# the service runs batched steps on an optimised BLAS, this test one sequence on MLX's
# own: the same float32 math, summed in another order
TOLERANCE = 2e-3


@pytest.fixture(scope="module")
def client(service) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{service.base_url}/v1", api_key="x", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def reference(default_model_dir: Path) -> LoadedModel:
    return load_for_serving(default_model_dir)  # fp32, as the worker serves it on CPU


@pytest.fixture(scope="module")
def vocabulary(reference: LoadedModel) -> TokenVocabulary:
    tokenizer = reference.tokenizer
    return TokenVocabulary(tokenizer, reference.config["vocab_size"], sorted(tokenizer.eos_token_ids))


def greedy_logprobs(loaded: LoadedModel, prompt_ids: list[int], num_tokens: int) -> list[np.ndarray]:
    """The log-softmax of the logits at each step of a greedy continuation of the prompt."""
    cache = make_prompt_cache(loaded.model)
    logits = loaded.model(mx.array([prompt_ids]), cache=cache)[0, -1]
    rows = []
    for _ in range(num_tokens):
        row = logits - mx.logsumexp(logits)
        rows.append(np.array(row))
        logits = loaded.model(mx.array([[int(mx.argmax(row).item())]]), cache=cache)[0, -1]
    return rows


def expect(rows: list[np.ndarray], vocabulary: TokenVocabulary,
           entries: list[tuple[bytes, float, list[tuple[bytes, float]]]]) -> None:
    """Each returned (token, logprob, alternatives) against the reference row of its step."""
    assert len(entries) == NUM_TOKENS
    for row, (token, logprob, alternatives) in zip(rows, entries):
        best = np.argsort(-row)[:TOP]
        assert token == vocabulary.token_bytes(int(best[0]))  # greedy: the most likely token
        assert abs(logprob - row[best[0]]) < TOLERANCE
        assert [b for b, _ in alternatives] == [vocabulary.token_bytes(int(t)) for t in best]
        assert np.allclose([v for _, v in alternatives], row[best], atol=TOLERANCE)


def chat_prompt(loaded: LoadedModel, messages: list[dict[str, Any]]) -> list[int]:
    text = loaded.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(loaded.tokenizer.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_match_the_models_log_softmax(client, model_id, reference, vocabulary, stream: bool) -> None:
    messages = [{"role": "user", "content": f"Tell me a story about a {'red' if stream else 'blue'} fox."}]
    kwargs: dict[str, Any] = {"model": model_id, "messages": messages, "temperature": 0, "max_tokens": NUM_TOKENS,
                              "logprobs": True, "top_logprobs": TOP}
    if stream:
        content = [entry for chunk in client.chat.completions.create(stream=True, **kwargs)
                   for choice in chunk.choices if choice.logprobs for entry in choice.logprobs.content]
    else:
        content = client.chat.completions.create(**kwargs).choices[0].logprobs.content
    entries = [(bytes(e.bytes), e.logprob, [(bytes(t.bytes), t.logprob) for t in e.top_logprobs]) for e in content]
    expect(greedy_logprobs(reference, chat_prompt(reference, messages), NUM_TOKENS), vocabulary, entries)


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs_match_the_models_log_softmax(client, model_id, reference, vocabulary,
                                                          stream: bool) -> None:
    prompt = f"The {'oldest' if stream else 'largest'} city in Europe is"
    kwargs: dict[str, Any] = {"model": model_id, "prompt": prompt, "temperature": 0, "max_tokens": NUM_TOKENS,
                              "logprobs": TOP}
    if stream:
        choices = [choice for chunk in client.completions.create(stream=True, **kwargs) for choice in chunk.choices]
        pieces, text = [c.logprobs for c in choices if c.logprobs], "".join(c.text for c in choices)
    else:
        choice = client.completions.create(**kwargs).choices[0]
        pieces, text = [choice.logprobs], choice.text
    tokens = [t for p in pieces for t in p.tokens]
    values = [v for p in pieces for v in p.token_logprobs]
    tops = [top for p in pieces for top in p.top_logprobs]
    offsets = [o for p in pieces for o in p.text_offset]
    assert offsets == [len("".join(tokens[:i])) for i in range(len(tokens))] and "".join(tokens) == text
    # the top dicts hold the TOP most likely tokens (the greedy sampled one among them)
    entries = [(t.encode(), v, sorted(((k.encode(), x) for k, x in top.items()), key=lambda kv: -kv[1]))
               for t, v, top in zip(tokens, values, tops)]
    prompt_ids = list(reference.tokenizer.encode(prompt))
    expect(greedy_logprobs(reference, prompt_ids, NUM_TOKENS), vocabulary, entries)
