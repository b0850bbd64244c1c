"""logprobs on the real default model through the real service and the openai SDK, chat and
completions, streamed and not: each figure equals the log-softmax stock MLX computes on the
same weights dequantized to float32 (tests/integration/stock_logprobs.py, in a process with
nothing of mlxd), on the same prompt tokens and the tokens the service chose; the top
alternatives are the reference's most likely tokens and the greedy token is the first."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from mlx_lm.utils import load_tokenizer

from tests.integration.logprobs_reference import (Step, StockReference, assert_same_choices, max_difference,
                                                  text_bytes)

pytestmark = pytest.mark.timeout(600)

NUM_TOKENS = 6
TOP = 3
# The service runs SmolLM2's 4-bit layers through mlxd's kernels (activations rounded to
# ~15 bits per block of 32, batched steps, fused projections, a KV cache), the reference
# every layer dequantized to float32 through MLX's own ops in one forward pass. Measured
# max |difference|: 1.8e-3 over these four tests' 24 tokens and their alternatives, 3.4e-3
# over 12 prompts x 12 tokens (top 5). The final norm's weight 0.1% off gives 3.6e-3 to
# 1.4e-2 (within the noise), 1% off 2.9e-2 to 0.14: the negative control uses 1%.
TOLERANCE = 1e-2
NEGATIVE_CONTROL = 1e-2


@pytest.fixture(scope="module")
def client(service) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{service.base_url}/v1", api_key="x", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path) -> Any:
    return load_tokenizer(default_model_dir)  # the tokenizer only: no model, no kernels in this process


@pytest.fixture(scope="module")
def reference(default_model_dir: Path) -> Iterator[StockReference]:
    stock = StockReference(default_model_dir)
    yield stock
    stock.close()


def expect(reference: StockReference, prompt_ids: list[int], served: list[Step]) -> None:
    """The served steps against the stock reference of the same tokens."""
    assert len(served) == NUM_TOKENS
    assert all(len(step.top) == TOP and step.top[0][0] == step.token for step in served)  # greedy: the first
    want = reference.steps([(prompt_ids, served)])[0]
    assert max_difference(served, want) < TOLERANCE
    assert_same_choices(served, want, TOLERANCE)
    # the comparison can fail: the final norm's weight 1% off moves them by more
    assert max_difference(served, reference.steps([(prompt_ids, served)], perturb=NEGATIVE_CONTROL)[0]) > TOLERANCE


def chat_prompt(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_match_the_models_log_softmax(client, model_id, tokenizer, reference,
                                                    stream: bool) -> None:
    messages = [{"role": "user", "content": f"Tell me a story about a {'red' if stream else 'blue'} fox."}]
    kwargs: dict[str, Any] = {"model": model_id, "messages": messages, "temperature": 0, "max_tokens": NUM_TOKENS,
                              "logprobs": True, "top_logprobs": TOP}
    if stream:
        content = [entry for chunk in client.chat.completions.create(stream=True, **kwargs)
                   for choice in chunk.choices if choice.logprobs for entry in choice.logprobs.content]
    else:
        content = client.chat.completions.create(**kwargs).choices[0].logprobs.content
    served = [Step(bytes(e.bytes), e.logprob, [(bytes(t.bytes), t.logprob) for t in e.top_logprobs]) for e in content]
    expect(reference, chat_prompt(tokenizer, messages), served)


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs_match_the_models_log_softmax(client, model_id, tokenizer, reference,
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
    served = [Step(text_bytes(t), v, sorted(((text_bytes(k), x) for k, x in top.items()), key=lambda kv: -kv[1]))
              for t, v, top in zip(tokens, values, tops)]
    expect(reference, list(tokenizer.encode(prompt)), served)
