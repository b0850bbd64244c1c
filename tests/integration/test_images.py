"""Images through every API to a vision model, on the real service: the test VLM
(tests/worker/tiny_vlm.py: SmolLM2's text weights, a random vision tower, mlx-vlm's
processor) gets a picture from the openai SDK (chat `image_url` with a data: URL, and a
Responses `input_image`) and the anthropic SDK (a base64 `image` block); the same picture
in the next turn hits the prefix cache past the image and a different one never does, and
changes the answer. A text-only model and a URL the config does not allow are clear 400s
in each API's shape."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.integration.service import Service, running_service
from tests.worker.test_vision import png
from tests.worker.tiny_vlm import make_tiny_vlm

pytestmark = pytest.mark.timeout(900)

VLM = "tiny-vlm"
TEXT = "smol"
SYSTEM = "You describe pictures. " + " ".join(f"Rule {i}: be brief about topic {i}." for i in range(8))


@pytest.fixture(scope="module")
def service(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    models = tmp_path_factory.mktemp("models")
    make_tiny_vlm(models / VLM, default_model_dir)
    os.symlink(default_model_dir, models / TEXT)
    home = tmp_path_factory.mktemp("home")
    with running_service(["--model-dir", str(models), "--model", VLM, "--no-cold-tier"], home) as svc:
        yield svc


@pytest.fixture(scope="module")
def client(service: Service) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{service.base_url}/v1", api_key="unused", max_retries=0, timeout=300)


def data_url(seed: int) -> str:
    return "data:image/png;base64," + base64.b64encode(png(seed)).decode()


def look(client: openai.OpenAI, seed: int, model: str = VLM) -> tuple[str, int, int]:
    answer = client.chat.completions.create(model=model, max_tokens=6, temperature=0, messages=[
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(seed)}},
                                     {"type": "text", "text": "What is in this picture?"}]}])
    usage = answer.usage
    return answer.choices[0].message.content or "", usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens


def test_the_model_list_says_which_model_sees(client: openai.OpenAI, service: Service) -> None:
    look(client, 7)  # loads the model, with a picture no other test sends
    cards = {m["id"]: m for m in httpx.get(f"{service.base_url}/v1/models").json()["data"]}
    assert cards[VLM]["vision"] is True
    assert httpx.get(f"{service.base_url}/health").json()["workers"][VLM]["vision"] is True


def test_the_same_picture_hits_the_cache_and_another_does_not(client: openai.OpenAI) -> None:
    first, prompt, cached = look(client, 1)
    again, _, cached_again = look(client, 1)
    other, _, cached_other = look(client, 2)
    assert first == again and cached_again > cached and cached_again >= prompt // 2  # past the picture
    assert other != first  # the picture reaches the model
    assert cached_other < cached_again  # the text before the picture only


def test_messages_and_responses_send_the_picture_the_same_way(client: openai.OpenAI, service: Service) -> None:
    chat_answer = look(client, 3)[0]
    claude = anthropic.Anthropic(base_url=service.base_url, api_key="unused", max_retries=0, timeout=300)
    message = claude.messages.create(model=VLM, max_tokens=6, system=SYSTEM, extra_body={"temperature": 0},
                                     messages=[{"role": "user", "content": [
                                         {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                      "data": base64.b64encode(png(3)).decode()}},
                                         {"type": "text", "text": "What is in this picture?"}]}])
    assert message.content[0].text == chat_answer and message.usage.cache_read_input_tokens > 0
    response = client.responses.create(model=VLM, instructions=SYSTEM, max_output_tokens=6, temperature=0,
                                       input=[{"role": "user", "content": [
                                           {"type": "input_image", "image_url": data_url(3)},
                                           {"type": "input_text", "text": "What is in this picture?"}]}])
    assert response.output_text == chat_answer


def test_refusals_are_400s_naming_the_part(client: openai.OpenAI, service: Service) -> None:
    with pytest.raises(openai.BadRequestError) as text_only:
        look(client, 1, model=TEXT)
    assert "'messages[1].content[0]' is an image" in text_only.value.message
    with pytest.raises(openai.BadRequestError) as url:
        client.chat.completions.create(model=VLM, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}])
    assert "allow_image_urls" in url.value.message
    claude = anthropic.Anthropic(base_url=service.base_url, api_key="unused", max_retries=0, timeout=300)
    with pytest.raises(anthropic.BadRequestError) as broken:
        claude.messages.create(model=VLM, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(b"not a picture").decode()}}]}])
    assert "not an image" in broken.value.message
    with pytest.raises(openai.BadRequestError) as responses_text_only:
        client.responses.create(model=TEXT, max_output_tokens=4, input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": data_url(1)}]}])
    assert "'input[0].content[0].image_url' is an image" in responses_text_only.value.message
    with pytest.raises(anthropic.BadRequestError) as messages_text_only:
        claude.messages.create(model=TEXT, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(png(1)).decode()}}]}])
    assert "reads text only" in messages_text_only.value.message
    assert look(client, 1)[0]  # the service serves on
