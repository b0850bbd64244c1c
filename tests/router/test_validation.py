"""router.validation: each bad parameter is a 400 naming it; good ones map onto SamplingParams."""

from __future__ import annotations

import re
from typing import Any

import pytest

from protocol.errors import RequestError
from protocol.messages import SamplingParams
from router.api.openai_chat import parse as parse_chat_request
from router.api.openai_completions import parse as parse_completion_request
from router.json_body import parse_json_body

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
TEXT = {"model": "m", "prompt": "hi"}


def chat(**fields: Any) -> dict[str, Any]:
    return {**CHAT, **fields}


@pytest.mark.parametrize("body, param", [
    ({"messages": CHAT["messages"]}, "model"),
    (chat(model=3), "model"),
    (chat(messages=[]), "messages"),
    (chat(messages="hi"), "messages"),
    (chat(messages=["hi"]), "messages"),
    (chat(messages=[{"role": "robot", "content": "x"}]), "messages"),
    (chat(messages=[{"role": "user", "content": 5}]), "messages"),
    (chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
     "messages"),
    (chat(messages=[{"role": "user", "content": [{"type": "text", "text": 1}]}]), "messages"),
    (chat(messages=[{"role": "user", "content": ["x"]}]), "messages"),
    (chat(max_tokens=0), "max_tokens"),
    (chat(max_tokens=1.5), "max_tokens"),
    (chat(max_tokens="10"), "max_tokens"),
    (chat(max_tokens=True), "max_tokens"),
    (chat(max_completion_tokens=-1), "max_completion_tokens"),
    (chat(temperature=-0.1), "temperature"),
    (chat(temperature=2.5), "temperature"),
    (chat(temperature="hot"), "temperature"),
    (chat(top_p=0), "top_p"),
    (chat(top_p=1.1), "top_p"),
    (chat(top_k=-2), "top_k"),
    (chat(top_k=2.5), "top_k"),
    (chat(min_p=1.5), "min_p"),
    (chat(stop=3), "stop"),
    (chat(stop=["a", 1]), "stop"),
    (chat(stop=[str(i) for i in range(17)]), "stop"),
    (chat(seed="x"), "seed"),
    (chat(seed=2**65), "seed"),
    (chat(n=2), "n"),
    (chat(n="1"), "n"),
    (chat(presence_penalty=3), "presence_penalty"),
    (chat(frequency_penalty=-2.5), "frequency_penalty"),
    (chat(repetition_penalty=0), "repetition_penalty"),
    (chat(logit_bias=[1]), "logit_bias"),
    (chat(logit_bias={"abc": 1}), "logit_bias"),
    (chat(logit_bias={"5": 101}), "logit_bias"),
    (chat(stream="yes"), "stream"),
    (chat(stream_options=True), "stream_options"),
    (chat(stream=True, stream_options={"include_usage": "yes"}), "stream_options"),
    (chat(user=5), "user"),
    (chat(tools={"type": "function"}), "tools"),
    (chat(tools=[{"type": "function"}]), "tools"),
    (chat(tool_choice=3), "tool_choice"),
    (chat(cache_salt=1), "cache_salt"),
    (chat(logprobs="yes"), "logprobs"),
    (chat(logprobs=True, top_logprobs=21), "top_logprobs"),
    (chat(top_logprobs=3), "top_logprobs"),
    (chat(response_format={"type": "xml"}), "response_format"),
    (chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}),
     "response_format"),
])
def test_bad_chat_parameter_is_named(body: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as err:
        parse_chat_request(body)
    assert err.value.status == 400
    assert err.value.param == param and param in err.value.message
    assert err.value.error_type == "invalid_request_error"


@pytest.mark.parametrize("messages, where", [
    ([{"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "image_url"}]}],
     "'messages[1].content[0]' must be an image URL"),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "input_audio"}]}],
     "'messages[1].content[0].type' is 'input_audio'"),
    ([{"role": "bot", "content": "a"}], "'messages[0].role' must be one of"),
])
def test_message_errors_point_at_the_exact_spot(messages: list[Any], where: str) -> None:
    with pytest.raises(RequestError, match=re.escape(where)):
        parse_chat_request(chat(messages=messages))


@pytest.mark.parametrize("body, param", [
    ({"model": "m"}, "prompt"),
    ({"model": "m", "prompt": 5}, "prompt"),
    ({"model": "m", "prompt": []}, "prompt"),
    ({"model": "m", "prompt": ["a", "b"]}, "prompt"),
    ({"model": "m", "prompt": [[1], [2]]}, "prompt"),
    ({"model": "m", "prompt": [1, -2]}, "prompt"),
    ({"model": "m", "prompt": [1, "a"]}, "prompt"),
    ({**TEXT, "echo": True}, "echo"),
    ({**TEXT, "best_of": 3}, "best_of"),
    ({**TEXT, "logprobs": 6}, "logprobs"),
    ({**TEXT, "logprobs": True}, "logprobs"),
    ({**TEXT, "logprobs": -1}, "logprobs"),
    ({**TEXT, "n": 3}, "n"),
])
def test_bad_completion_parameter_is_named(body: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as err:
        parse_completion_request(body)
    assert (err.value.status, err.value.param) == (400, param) and param in err.value.message


@pytest.mark.parametrize("fields, expected", [
    ({}, SamplingParams()),
    ({"max_tokens": 7}, SamplingParams(max_tokens=7)),
    ({"max_tokens": 7, "max_completion_tokens": 9}, SamplingParams(max_tokens=9)),
    ({"temperature": 0, "top_p": 0.5, "top_k": 40, "min_p": 0.05},
     SamplingParams(temperature=0.0, top_p=0.5, top_k=40, min_p=0.05)),
    ({"top_k": -1}, SamplingParams(top_k=0)),
    ({"stop": "END"}, SamplingParams(stop=["END"])),
    ({"stop": ["a", "", "b"]}, SamplingParams(stop=["a", "b"])),
    ({"stop": None, "seed": None, "n": 1, "temperature": None}, SamplingParams()),
    ({"seed": 42}, SamplingParams(seed=42)),
    ({"presence_penalty": 0.5, "frequency_penalty": -1, "repetition_penalty": 1.1},
     SamplingParams(presence_penalty=0.5, frequency_penalty=-1.0, repetition_penalty=1.1)),
    ({"logit_bias": {"50256": -100, "7": 2.5}}, SamplingParams(logit_bias={50256: -100.0, 7: 2.5})),
])
def test_good_parameters_map_to_sampling(fields: dict[str, Any], expected: SamplingParams) -> None:
    assert parse_chat_request(chat(**fields)).add.sampling == expected
    assert parse_completion_request({**TEXT, **fields}).add.sampling == expected


@pytest.mark.parametrize("content, text", [
    ("plain", "plain"),
    ([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "a\nb"),
    (None, ""),
])
def test_message_content_is_normalized_to_a_string(content: Any, text: str) -> None:
    call = {"id": "x", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    message = {"role": "assistant", "content": content, "tool_calls": [call]}
    add = parse_chat_request(chat(messages=[message])).add
    assert add.messages == [{"role": "assistant", "content": text, "tool_calls": [call]}]
    assert add.prompt is None


@pytest.mark.parametrize("prompt, expected", [
    ("hello", "hello"),
    (["hello"], "hello"),
    ([1, 2, 3], [1, 2, 3]),
    ([[1, 2, 3]], [1, 2, 3]),
])
def test_prompt_forms(prompt: Any, expected: Any) -> None:
    parsed = parse_completion_request({"model": "m", "prompt": prompt})
    assert parsed.add.prompt == expected and parsed.add.messages is None
    assert parsed.kind == "text" and parsed.add.request_id.startswith("cmpl-")


def test_stream_flags_tools_salt_and_unknown_fields() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    parsed = parse_chat_request(chat(stream=True, stream_options={"include_usage": True}, tools=tools,
                                     tool_choice="auto", cache_salt="s", user="u", whatever={"x": 1}))
    assert parsed.stream and parsed.include_usage
    assert parsed.add.tools == tools and parsed.add.cache_salt == "s"
    assert parsed.kind == "chat" and parsed.model == "m" and parsed.add.request_id.startswith("chatcmpl-")
    assert not parse_chat_request(chat(stream=False, stream_options=None)).include_usage


@pytest.mark.parametrize("raw", [b"{bad", b"", b"[1, 2]", b'"x"', b'{"a": NaN}', b"\xff\xfe"])
def test_malformed_body_is_a_400(raw: bytes) -> None:
    with pytest.raises(RequestError) as err:
        parse_json_body(raw)
    assert err.value.status == 400 and err.value.param is None


def test_request_ids_are_unique() -> None:
    assert parse_chat_request(CHAT).add.request_id != parse_chat_request(CHAT).add.request_id
