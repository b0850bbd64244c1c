"""Token-id prompts on /v1/completions, through the real service and the openai SDK: the ids
of a text prompt are answered exactly as the text is (same text, same token counts,
greedy), as a bare list or a batch of one; a batch of two is refused whole, naming `prompt`.
Each request has a cache salt of its own, so every answer is computed from scratch."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from tokenizers import Tokenizer

pytestmark = pytest.mark.timeout(300)

PROMPTS = ("The three primary colors are", "def fibonacci(n):\n    ")
MAX_TOKENS = 16
SALT = __name__  # this module's cache salts: no other module on the shared service uses them


@pytest.fixture(scope="module")
def client(service) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{service.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(default_model_dir / "tokenizer.json"))


def complete(client: openai.OpenAI, model_id: str, prompt, salt: str, **kwargs):
    return client.completions.create(model=model_id, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                     extra_body={"cache_salt": f"{SALT}-{salt}"}, **kwargs)


@pytest.mark.parametrize("text", PROMPTS, ids=["words", "code"])
def test_the_ids_of_a_text_prompt_are_answered_as_the_text(client, model_id, tokenizer, text: str) -> None:
    ids = tokenizer.encode(text).ids
    by_text = complete(client, model_id, text, f"text:{text}")
    assert by_text.usage.prompt_tokens == len(ids)  # the worker tokenizes the text to these very ids
    assert by_text.choices[0].text.strip() and by_text.usage.completion_tokens == MAX_TOKENS
    for shape, prompt in (("ids", ids), ("batch of one", [ids])):
        by_ids = complete(client, model_id, prompt, f"{shape}:{text}")
        assert by_ids.choices[0].text == by_text.choices[0].text, shape
        assert by_ids.choices[0].finish_reason == by_text.choices[0].finish_reason
        assert (by_ids.usage.prompt_tokens, by_ids.usage.completion_tokens) == (
            by_text.usage.prompt_tokens, by_text.usage.completion_tokens), shape
    streamed = "".join(chunk.choices[0].text for chunk in complete(client, model_id, ids, f"stream:{text}", stream=True)
                       if chunk.choices)
    assert streamed == by_text.choices[0].text


def test_a_batch_of_two_id_prompts_is_refused_naming_prompt(client, model_id, tokenizer) -> None:
    """One prompt per request (README, `POST /v1/completions`): a batch of two is a 400
    before anything runs, and the service answers the next request."""
    batch = [tokenizer.encode(text).ids for text in PROMPTS]
    with pytest.raises(openai.BadRequestError) as refused:
        complete(client, model_id, batch, "batch of two")
    assert refused.value.param == "prompt" and "one prompt per request" in refused.value.body["message"]
    alone = [complete(client, model_id, ids, f"after batch:{i}").choices[0].text for i, ids in enumerate(batch)]
    assert all(text.strip() for text in alone)
