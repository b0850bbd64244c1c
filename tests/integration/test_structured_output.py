"""Structured output by constrained decoding, on the real default model through the real
service and the official openai SDK: parse() with a Pydantic model, json_object, the 400
for a schema feature the grammar engine cannot enforce, constrained and free requests in
one batch, and a constrained answer from a cached prefix."""

from __future__ import annotations

import json
import threading
import time
from typing import Literal

import openai
import pytest
from openai.lib._parsing._completions import type_to_response_format_param
from pydantic import BaseModel

pytestmark = pytest.mark.timeout(600)

SYSTEM = ("You are a helpful assistant for a pet shop. " +
          " ".join(f"Rule {i}: pets of aisle {i} are described with care and precision." for i in range(20)))


class Owner(BaseModel):
    name: str
    city: str


class Pet(BaseModel):
    name: str
    species: Literal["cat", "dog", "parrot"]
    age: int
    owner: Owner | None
    tags: list[str]


# exactly what parse() sends for Pet, for the requests that stream or set other fields
PET_FORMAT = type_to_response_format_param(Pet)
SALT = __name__  # this module's cache salts: no other module on the shared service uses them


@pytest.fixture(scope="module")
def client(service) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{service.base_url}/v1", api_key="x", max_retries=0, timeout=300)


def test_parse_with_a_pydantic_model(client, model_id) -> None:
    completion = client.chat.completions.parse(
        model=model_id, messages=[{"role": "user", "content": "Describe a pet of our shop."}],
        response_format=Pet, temperature=0, max_tokens=200)
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"  # the grammar completed: only EOS was allowed
    assert isinstance(choice.message.parsed, Pet)
    assert Pet.model_validate_json(choice.message.content) == choice.message.parsed


def test_json_object_returns_a_json_object(client, model_id) -> None:
    completion = client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "Give me JSON about Paris"}],
        response_format={"type": "json_object"}, temperature=0, max_tokens=200)
    assert completion.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(completion.choices[0].message.content), dict)


def test_an_unsupported_schema_feature_is_a_400_naming_it(client, model_id) -> None:
    schema = {"type": "object", "properties": {"ids": {"type": "array", "items": {"type": "integer"},
                                                        "uniqueItems": True}}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": "ids?"}],
            response_format={"type": "json_schema", "json_schema": {"name": "Ids", "schema": schema}})
    error = err.value.response.json()["error"]
    assert error["param"] == "response_format" and error["type"] == "invalid_request_error"
    assert "uniqueItems" in error["message"]


def stream_chat(client, model_id: str, messages: list[dict], stamps: list[float], **extra) -> str:
    """A greedy streamed answer; each content chunk's arrival time goes to `stamps`."""
    text = ""
    for chunk in client.chat.completions.create(model=model_id, messages=messages, temperature=0, max_tokens=48,
                                                stream=True, **extra):
        for choice in chunk.choices:
            if choice.delta.content:
                stamps.append(time.monotonic())
                text += choice.delta.content
    return text


def test_a_free_request_beside_a_constrained_one_equals_its_solo_run(client, model_id) -> None:
    free = [{"role": "user", "content": "Write two sentences about the sea."}]
    constrained = [{"role": "user", "content": "Describe a pet of our shop."}]
    solo = stream_chat(client, model_id, free, [], extra_body={"cache_salt": f"{SALT}-solo"})
    results: dict[str, str] = {}
    stamps: dict[str, list[float]] = {"free": [], "json": []}
    threads = [
        threading.Thread(target=lambda: results.update(free=stream_chat(
            client, model_id, free, stamps["free"], extra_body={"cache_salt": f"{SALT}-pair"}))),
        threading.Thread(target=lambda: results.update(json=stream_chat(
            client, model_id, constrained, stamps["json"], response_format=PET_FORMAT,
            extra_body={"cache_salt": f"{SALT}-pair"}))),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # both decoded at once: one worker, one batch
    assert max(s[0] for s in stamps.values()) < min(s[-1] for s in stamps.values())
    assert results["free"] == solo
    assert results["json"].startswith("{")


def test_a_constrained_answer_from_a_cached_prefix_equals_scratch(client, model_id) -> None:
    def ask(question: str, salt: str, **extra):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        return client.chat.completions.create(model=model_id, messages=messages, temperature=0,
                                              extra_body={"cache_salt": f"{SALT}-{salt}"},
                                              **{"max_tokens": 200, **extra})

    question = "Describe the pet of aisle 7."
    scratch = ask(question, "scratch", response_format=PET_FORMAT)
    assert scratch.usage.prompt_tokens_details.cached_tokens == 0
    ask("Which aisle has parrots?", "warm", max_tokens=4)  # caches the shared system prompt
    hit = ask(question, "warm", response_format=PET_FORMAT)
    assert hit.usage.prompt_tokens_details.cached_tokens >= 256
    assert hit.choices[0].message.content == scratch.choices[0].message.content
    Pet.model_validate_json(hit.choices[0].message.content)
