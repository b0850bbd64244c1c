"""router.profiles: profile names split at the colon; a profile fills only what the client left out."""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest

from protocol.codec import decode, encode
from protocol.messages import AddRequest
from router.profiles import Profile
from router.profiles import SAMPLING_DEFAULTS, split_model_name
from router.api.openai_chat import parse as parse_chat_request
from router.api.anthropic_messages import parse as parse_messages_request
from router.api.openai_completions import parse as parse_completion_request
from router.api.openai_responses import parse as parse_responses_request
from router.api.response_store import ResponseStore

CHAT = {"model": "smol:coder", "messages": [{"role": "user", "content": "hi"}]}
TEXT = {"model": "smol:coder", "prompt": "def f("}
FULL = Profile(temperature=0.2, top_p=0.9, top_k=40, min_p=0.05, repetition_penalty=1.1, presence_penalty=0.5,
               frequency_penalty=0.3, stop=("###", "\n\n"), seed=7, max_tokens=256, context_limit=4096,
               system_prompt="You write Python.")
# a client value for each parameter a profile defaults, all different from FULL's
CLIENT = {"temperature": 1.5, "top_p": 0.5, "top_k": 5, "min_p": 0.2, "repetition_penalty": 1.3,
          "presence_penalty": -1.0, "frequency_penalty": 1.0, "seed": 99, "stop": ["END"], "max_tokens": 10}


@pytest.mark.parametrize("name, expected", [
    ("smol", ("smol", None)),
    ("smol:coder", ("smol", "coder")),
    ("mlx-community/Qwen2.5-0.5B:long", ("mlx-community/Qwen2.5-0.5B", "long")),
    ("mlx-community/Qwen2.5-0.5B", ("mlx-community/Qwen2.5-0.5B", None)),
    ("smol:", ("smol", "")),
    ("smol:a:b", ("smol", "a:b")),
])
def test_split_model_name(name: str, expected: tuple[str, str | None]) -> None:
    assert split_model_name(name) == expected


def sampled(parsed: Any) -> dict[str, Any]:
    """The parameters a profile defaults, as the parsed request holds them."""
    sampling = parsed.add.sampling
    return {name: getattr(sampling, name) for name in CLIENT}


PROFILED = {**{k: getattr(FULL, k) for k in SAMPLING_DEFAULTS}, "stop": ["###", "\n\n"], "max_tokens": 256}
PARSERS = {"chat": parse_chat_request, "text": parse_completion_request}


@pytest.mark.parametrize("kind, base", [("chat", CHAT), ("text", TEXT)])
def test_profile_fills_every_missing_parameter(kind: str, base: dict[str, Any]) -> None:
    assert sampled(PARSERS[kind](base, FULL)) == PROFILED


@pytest.mark.parametrize("name", sorted(CLIENT))
@pytest.mark.parametrize("kind, base", [("chat", CHAT), ("text", TEXT)])
def test_client_value_wins(name: str, kind: str, base: dict[str, Any]) -> None:
    got = sampled(PARSERS[kind]({**base, name: CLIENT[name]}, FULL))
    assert got == {**PROFILED, name: CLIENT[name]}


@pytest.mark.parametrize("name", sorted(CLIENT))
def test_null_counts_as_not_sent(name: str) -> None:
    assert sampled(parse_chat_request({**CHAT, name: None}, FULL)) == PROFILED


def test_max_completion_tokens_counts_as_max_tokens() -> None:
    assert parse_chat_request({**CHAT, "max_completion_tokens": 12}, FULL).add.sampling.max_tokens == 12


def test_empty_profile_changes_nothing() -> None:
    plain, profiled = parse_chat_request(CHAT), parse_chat_request(CHAT, Profile())
    assert profiled.add.sampling == plain.add.sampling and profiled.add.messages == plain.add.messages


@pytest.mark.parametrize("messages, expected_first", [
    ([{"role": "user", "content": "hi"}], {"role": "system", "content": "You write Python."}),
    ([{"role": "system", "content": "mine"}, {"role": "user", "content": "hi"}], {"role": "system", "content": "mine"}),
    ([{"role": "user", "content": "hi"}, {"role": "system", "content": "late"}], {"role": "user", "content": "hi"}),
    # the parser reads a developer message as the system one: the client's, kept
    ([{"role": "developer", "content": "dev"}, {"role": "user", "content": "hi"}],
     {"role": "system", "content": "dev"}),
])
def test_system_prompt_only_when_absent(messages: list[dict[str, Any]], expected_first: dict[str, Any]) -> None:
    got = parse_chat_request({**CHAT, "messages": messages}, FULL).add.messages
    assert got is not None and got[0]["role"] == expected_first["role"]
    assert got[0]["content"] == expected_first["content"]
    inserted = expected_first["content"] == FULL.system_prompt
    assert len(got) == len(messages) + inserted


def test_completions_ignore_system_prompt() -> None:
    parsed = parse_completion_request(TEXT, FULL)
    assert parsed.add.prompt == "def f(" and parsed.add.messages is None


def test_the_body_is_not_modified() -> None:
    body = copy.deepcopy(CHAT)
    parse_chat_request(body, FULL)
    assert body == CHAT


MESSAGES = {"model": "smol:coder", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def test_a_profile_fills_an_anthropic_request_in_its_own_fields() -> None:
    """Applied to the parsed request: the profile's stop strings reach the sampling, and an
    Anthropic body's `stop` (not one of its fields) is never read as stop_sequences."""
    parsed = parse_messages_request(MESSAGES, FULL)
    assert parsed.add.sampling.stop == ["###", "\n\n"] and parsed.add.sampling.temperature == FULL.temperature
    assert parsed.add.sampling.max_tokens == 8  # the client's max_tokens wins
    assert parse_messages_request({**MESSAGES, "stop_sequences": ["END"]}, FULL).add.sampling.stop == ["END"]
    assert parse_messages_request({**MESSAGES, "stop": ["END"]}).add.sampling.stop == []
    with_system = parse_messages_request({**MESSAGES, "system": "mine"}, FULL).add.messages
    assert with_system is not None and [m["content"] for m in with_system if m["role"] == "system"] == ["mine"]


def test_the_profiles_system_prompt_moves_a_messages_breakpoint_with_its_message() -> None:
    body = {**MESSAGES, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}]}
    plain, profiled = parse_messages_request(body), parse_messages_request(body, FULL)
    assert profiled.add.messages is not None and profiled.add.messages[0]["content"] == FULL.system_prompt
    (before,), (after,) = plain.add.cache_breakpoints, profiled.add.cache_breakpoints
    assert after.message_index == before.message_index + 1
    assert profiled.add.messages[after.message_index] == plain.add.messages[before.message_index]


def test_responses_echo_the_profiles_sampling() -> None:
    parsed = parse_responses_request({"model": "smol:coder", "input": "hi"}, FULL, store=ResponseStore())
    assert parsed.echo["temperature"] == FULL.temperature and parsed.add.sampling.max_tokens == 256


def test_parse_with_profile() -> None:
    parsed = parse_chat_request({**CHAT, "temperature": 1.0}, FULL)
    sampling = parsed.add.sampling
    assert (sampling.temperature, sampling.top_k, sampling.seed, sampling.max_tokens) == (1.0, 40, 7, 256)
    assert sampling.stop == ["###", "\n\n"]
    assert parsed.add.messages is not None and parsed.add.messages[0]["role"] == "system"
    assert parsed.context_limit == parsed.add.context_limit == 4096
    assert parsed.model == "smol:coder"  # answers name the model the client asked for


@pytest.mark.parametrize("parse, body", [(parse_chat_request, CHAT), (parse_completion_request, TEXT)])
def test_parse_without_profile_is_unchanged(parse: Any, body: dict[str, Any]) -> None:
    parsed = parse(body)
    assert parsed.context_limit is None and parsed.add.context_limit is None
    assert parsed.add.sampling.temperature == 1.0 and parsed.add.sampling.max_tokens is None


def test_context_limit_crosses_the_wire() -> None:
    add = parse_chat_request(CHAT, Profile(context_limit=100)).add
    message, _ = decode(encode(add))
    assert isinstance(message, AddRequest) and message.context_limit == 100


@pytest.mark.parametrize("parse, body", [
    (parse_chat_request, CHAT),
    (parse_messages_request, {**CHAT, "max_tokens": 8}),
    (functools.partial(parse_responses_request, store=ResponseStore()), {"model": "smol:coder", "input": "hi"}),
])
def test_the_profiles_prompt_layout_crosses_the_wire(parse: Any, body: dict[str, Any]) -> None:
    """A profile may render its chat prompts as the template does (`prompt_layout`); without
    one the worker's own setting decides (None)."""
    add = parse(body, Profile(prompt_layout="template")).add
    message, _ = decode(encode(add))
    assert isinstance(message, AddRequest) and message.prompt_layout == "template"
    assert parse(body, None).add.prompt_layout is None


def test_a_profiles_reasoning_budget_fills_in_and_each_apis_own_field_wins() -> None:
    profile = Profile(reasoning_budget=300)
    messages = {"model": "smol:think", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    assert parse_chat_request(CHAT, profile).add.reasoning_budget == 300
    assert parse_chat_request({**CHAT, "reasoning_effort": "low"}, profile).add.reasoning_budget == 1024
    assert parse_messages_request({**messages, "thinking": {"type": "enabled", "budget_tokens": 40}},
                                  profile).add.reasoning_budget == 40
    assert parse_messages_request({**messages, "thinking": {"type": "disabled"}}, profile).add.reasoning_budget == 0
    assert parse_messages_request(messages, None).add.reasoning_budget is None
    responses = {"model": "smol", "input": "hi", "reasoning": {"effort": "high"}}
    assert parse_responses_request(responses, None, store=ResponseStore()).add.reasoning_budget == 16384
