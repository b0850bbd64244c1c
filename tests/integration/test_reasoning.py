"""Reasoning in OpenAI chat's own field, on the real service: a tiny random model whose
chat template opens a `<think>` span in the generation prompt (as DeepSeek-R1's does)
answers inside that span, so all its text is reasoning. It arrives as `reasoning_content`,
streamed and not (the same text both ways), never as `content`, and it is exactly the text
the model generated (the same prompt through /v1/completions, which splits nothing). The
worker reports the span in /v1/models."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.integration.service import Service, running_service
from tests.integration.test_anthropic_messages import CLIENTS, shortened, stream_raw
from tests.integration.test_pool import make_tiny_dir

pytestmark = pytest.mark.timeout(600)

MODEL = "tiny-reasoner"
# SmolLM2's template, its generation prompt opening the reasoning span
TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
            "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n<think>\n' }}"
            "{% endif %}{# a reasoning model: its span closes with </think> #}")
ASK = [{"role": "user", "content": "What is 2 + 2?"}]
GREEDY = {"temperature": 0}  # the anthropic SDK's types leave temperature out here


@pytest.fixture(scope="module")
def service(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    models = tmp_path_factory.mktemp("models")
    target = make_tiny_dir(models / MODEL, default_model_dir)
    config = json.loads((target / "tokenizer_config.json").read_text())
    config["chat_template"] = TEMPLATE
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    home = tmp_path_factory.mktemp("home")
    with running_service(["--model-dir", str(models), "--model", MODEL, "--no-cold-tier"], home) as svc:
        yield svc


@pytest.fixture(scope="module")
def client(service: Service) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{service.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_the_model_list_reports_the_span(service: Service) -> None:
    (card,) = [m for m in httpx.get(f"{service.base_url}/v1/models").json()["data"] if m["id"] == MODEL]
    assert card["reasoning"] == {"open": "<think>", "close": "</think>", "opens_in_prompt": True}


def test_reasoning_travels_as_reasoning_content_streamed_or_not(client: openai.OpenAI, service: Service) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=24, temperature=0)
    message = whole.choices[0].message
    reasoning = message.model_extra["reasoning_content"]
    assert reasoning and not message.content
    details = whole.usage.completion_tokens_details
    assert details.reasoning_tokens == whole.usage.completion_tokens == 24  # cut inside the span: all of it

    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=24, temperature=0,
                                                 stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == reasoning
    assert not "".join(d.content or "" for d in deltas)
    assert sum(1 for d in deltas if (d.model_extra or {}).get("reasoning_content")) > 1  # streamed as generated

    rendered = f"<|im_start|>user\n{ASK[0]['content']}<|im_end|>\n<|im_start|>assistant\n<think>\n"  # TEMPLATE's
    raw = httpx.post(f"{service.base_url}/v1/completions", json={
        "model": MODEL, "prompt": rendered, "max_tokens": 24, "temperature": 0}, timeout=120).json()
    assert raw["choices"][0]["text"] == reasoning  # moved to its field whole: nothing lost, nothing added


def test_anthropic_gets_a_thinking_block_with_a_signature_streamed_or_not(client: openai.OpenAI,
                                                                          service: Service) -> None:
    reasoning = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=24, temperature=0) \
        .choices[0].message.model_extra["reasoning_content"]
    anthropic_client = anthropic.Anthropic(base_url=service.base_url, api_key="unused", max_retries=0, timeout=120)
    message = anthropic_client.messages.create(model=MODEL, messages=ASK, max_tokens=24, extra_body=GREEDY)
    (block,) = message.content  # all of it reasoning: one thinking block, no text
    assert block.type == "thinking" and block.thinking == reasoning and block.signature.startswith("mlxd-")

    with anthropic_client.messages.stream(model=MODEL, messages=ASK, max_tokens=24, extra_body=GREEDY) as stream:
        events = list(stream)
        final = stream.get_final_message()
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert "".join(d.thinking for d in deltas if d.type == "thinking_delta") == reasoning
    assert [d.signature for d in deltas if d.type == "signature_delta"] == [block.signature]
    assert [b.model_dump() for b in final.content] == [block.model_dump()]


def test_responses_carry_it_as_a_reasoning_item_streamed_or_not(client: openai.OpenAI) -> None:
    reasoning = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=24, temperature=0) \
        .choices[0].message.model_extra["reasoning_content"]
    response = client.responses.create(model=MODEL, input=ASK[0]["content"], max_output_tokens=24, temperature=0)
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "message"]  # all of it reasoning; the message is empty, never the span
    assert response.output[0].content[0].text == reasoning and response.output_text == ""
    assert response.usage.output_tokens_details.reasoning_tokens == response.usage.output_tokens

    events = list(client.responses.create(model=MODEL, input=ASK[0]["content"], max_output_tokens=24,
                                          temperature=0, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == reasoning
    assert not [e for e in events if e.type == "response.output_text.delta" and e.delta]
    final = events[-1].response
    assert [item.type for item in final.output] == kinds and final.output[0].content[0].text == reasoning


def test_a_budget_closes_the_span_and_the_model_answers(client: openai.OpenAI, service: Service) -> None:
    full = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=24, temperature=0) \
        .choices[0].message.model_extra["reasoning_content"]
    anthropic_client = anthropic.Anthropic(base_url=service.base_url, api_key="unused", max_retries=0, timeout=120)
    message = anthropic_client.messages.create(model=MODEL, messages=ASK, max_tokens=24, extra_body=GREEDY,
                                               thinking={"type": "enabled", "budget_tokens": 5})
    thinking, text = message.content
    assert thinking.type == "thinking" and text.type == "text" and text.text
    assert full.startswith(thinking.thinking.rstrip()) and len(thinking.thinking.rstrip()) < len(full)
    assert "</think>" not in text.text  # the server closed the span; the answer is what followed

    none = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=24, temperature=0,
                                          reasoning_effort="minimal")  # a budget of 0: no reasoning at all
    assert not none.choices[0].message.model_extra.get("reasoning_content") and none.choices[0].message.content
    spent = none.usage.completion_tokens_details.reasoning_tokens
    assert 0 < spent < none.usage.completion_tokens  # the close it was given is the span's; the answer is not
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, reasoning_effort="extreme")


@pytest.mark.parametrize("capture", ["claude-code-messages-thinking-block-in-history",
                                     "anthropic-python-messages-stream-tools-thinking"])
def test_captured_thinking_bodies_stream_a_thinking_block_and_a_budget_closes_it(service: Service,
                                                                                capture: str) -> None:
    """The captured bodies as their clients sent them (headers, `thinking` enabled, Claude
    Code's thinking block with another server's signature in the history), on this model
    and cut to 24 tokens: the answer streams a thinking block with its signature; with a
    budget of 4 the span closes and the model answers after it."""
    recorded = json.loads((CLIENTS / f"{capture}.json").read_text())
    headers = {k: v for k, v in recorded["headers"].items()
               if k.lower() not in ("content-length", "host", "accept-encoding")}
    for budget in (None, 4):
        body = {**shortened(recorded["body"]), "model": MODEL, "max_tokens": 24, "temperature": 0}
        if budget is not None:
            body["thinking"] = {**body["thinking"], "budget_tokens": budget}
        events = stream_raw(service, body, recorded["path"], headers)
        starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
        deltas = [e["delta"]["type"] for e in events if e["type"] == "content_block_delta"]
        assert starts[0] == "thinking" and "thinking_delta" in deltas and "signature_delta" in deltas, events
        assert (len(starts) > 1) == (budget is not None), starts  # closed by the budget: an answer follows
