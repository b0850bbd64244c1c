"""Qwen2.5-Coder-0.5B served as provisioned (its Q4_K_M file: 4/5/8-bit layers kept quantized
for mlxd's kernels, the rest dequantized) against stock MLX on the same weights dequantized
to float32, in a process with nothing of mlxd (tests/integration/stock_logprobs.py): the
logprobs the service returns for its greedy tokens and their alternatives."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from mlx_lm.utils import load_tokenizer

from tests.integration.logprobs_reference import (Step, StockReference, assert_same_choices, max_difference,
                                                  text_bytes)
from tests.integration.service import Service, running_service

pytestmark = pytest.mark.timeout(900)

NUM_TOKENS = 6
TOP = 5
# Measured max |served - reference|: 9.5e-4 over 6 prompts x 8 tokens and their top 5
# (the kernels round activations to ~15 bits per block of 32; the reference computes in
# float32 throughout). The final norm's weight 1% off moves them by 3.0e-2 to 0.14.
TOLERANCE = 5e-3
NEGATIVE_CONTROL = 1e-2


@pytest.fixture(scope="module")
def qwen_service(qwen_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with running_service(["--model", str(qwen_model_dir)], tmp_path_factory.mktemp("home")) as svc:
        yield svc


def served_steps(client: openai.OpenAI, prompt: list[int]) -> list[Step]:
    """Greedy completion of token ids (exactly these prompt tokens) with its logprobs."""
    choice = client.completions.create(model="qwen2.5-coder-0.5b", prompt=prompt, temperature=0,
                                       max_tokens=NUM_TOKENS, logprobs=TOP).choices[0]
    figures = choice.logprobs
    return [Step(text_bytes(t), v, sorted(((text_bytes(k), x) for k, x in top.items()), key=lambda kv: -kv[1]))
            for t, v, top in zip(figures.tokens, figures.token_logprobs, figures.top_logprobs)]


def test_served_logprobs_match_stock_mlx_on_the_dequantized_weights(qwen_service: Service,
                                                                    qwen_model_dir: Path) -> None:
    tokenizer = load_tokenizer(qwen_model_dir)  # the tokenizer only: no model, no kernels in this process
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Write a Python function that adds two numbers."}],
                                         add_generation_prompt=True, tokenize=False)
    prompts = [list(tokenizer.encode(chat, add_special_tokens=False)),
               list(tokenizer.encode("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"))]
    client = openai.OpenAI(base_url=f"{qwen_service.base_url}/v1", api_key="x", max_retries=0, timeout=300)
    cases = [(prompt, served_steps(client, prompt)) for prompt in prompts]
    for _, served in cases:
        assert len(served) == NUM_TOKENS
        assert all(len(step.top) == TOP and step.top[0][0] == step.token for step in served)  # greedy: the first
    reference = StockReference(qwen_model_dir)
    try:
        wanted = reference.steps(cases)
        for (_, served), want in zip(cases, wanted):
            assert max_difference(served, want) < TOLERANCE
            assert_same_choices(served, want, TOLERANCE)
        # the comparison can fail: the final norm's weight 1% off moves them by more
        for (_, served), off in zip(cases, reference.steps(cases, perturb=NEGATIVE_CONTROL)):
            assert max_difference(served, off) > TOLERANCE
    finally:
        reference.close()
