"""Property: whatever body a client sends, the real service answers 2xx or a 4xx in the
API's error shape, never a 5xx, never a hang, and goes on serving (issue 11).

Bodies are drawn from the shapes of the OpenAI chat and completions APIs with extreme
values in every slot: integers past 64 bits, lone surrogates, deep nesting, NaN and
infinities, empty and oversized strings, wrong types. Valid output budgets are kept tiny
(max_tokens 1-3, and the service's default is 3) so each example costs a fraction of a
second; the large valid values are covered by the clamping tests elsewhere.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.integration.service import Service

pytestmark = [pytest.mark.timeout(900),
              # a failing example's repr can be megabytes (oversized strings): expected here
              pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")]

MODEL = "SmolLM2-135M-Instruct"
SURROGATES = ["\ud800", "a\udfffb", "\udc00\ud800"]
HUGE_INTS = [2**63, 2**64, -(2**63) - 1, 2**200, -(10**30)]


@pytest.fixture(scope="module")
def svc(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    service = Service(["--model", str(default_model_dir), "--max-output-tokens", "8"],
                      home=tmp_path_factory.mktemp("home"))
    try:
        service.wait_ready()
        yield service
    finally:
        service.stop()


def deep_marker(depth: int) -> str:
    """A placeholder for JSON nested `depth` levels, spliced in as text by `to_wire`: the
    nested value itself would overflow Python's recursion (json.dumps, Hypothesis' printer)
    on the client side before it ever reached the server."""
    return f"\x00DEEP{depth}\x00"


def nested_json(depth: int) -> str:
    opens = "".join("[" if i % 2 else '{"k": ' for i in range(depth))
    closes = "".join("]" if i % 2 else "}" for i in reversed(range(depth)))
    return opens + "1" + closes


def to_wire(body: dict) -> bytes:
    """JSON as a careless client sends it: NaN/Infinity literals, \ud800 escapes, and
    the deep nesting markers expanded."""
    text = json.dumps(body, allow_nan=True)
    return re.sub(r'"\\u0000DEEP(\d+)\\u0000"', lambda m: nested_json(int(m.group(1))), text).encode()


texts = st.one_of(
    st.text(max_size=40),
    st.sampled_from(SURROGATES),
    st.sampled_from(["", " ", "\x00", "\n" * 50]),
    st.sampled_from([700_000, 3_000_000]).map(lambda n: "ab" * (n // 2)),  # over the context bound
)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5), st.sampled_from(HUGE_INTS),
    st.floats(allow_nan=True, allow_infinity=True), texts,
)
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)
deep = st.integers(50, 3000).map(deep_marker)
anything = st.one_of(json_values, deep)

small_tokens = st.integers(1, 3)
bad_tokens = st.one_of(st.integers(max_value=0), st.integers(min_value=2**31), st.sampled_from(HUGE_INTS),
                       st.floats(), texts, st.booleans())
content = st.one_of(texts, st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", 3]),
                                                            "text": texts}), max_size=3), anything)
message = st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(["user", "system", "assistant", "tool", "developer"]), texts),
     "content": content},
    optional={"name": texts, "tool_calls": anything, "tool_call_id": anything, "extra": anything},
)
common = {
    "max_tokens": st.one_of(small_tokens, bad_tokens),
    "max_completion_tokens": st.one_of(small_tokens, bad_tokens),
    "temperature": st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3), texts),
    "top_p": st.one_of(st.floats(allow_nan=True), scalars),
    "top_k": st.one_of(st.integers(-2, 100), st.sampled_from(HUGE_INTS), scalars),
    "min_p": scalars,
    "seed": st.one_of(st.integers(-(2**63), 2**64 - 1), st.sampled_from(HUGE_INTS), scalars),
    "stop": st.one_of(texts, st.lists(texts, max_size=20), scalars),
    "logit_bias": st.one_of(st.dictionaries(st.one_of(st.integers(-5, 2**40).map(str), texts),
                                            st.one_of(st.floats(-200, 200), scalars), max_size=3), scalars),
    "presence_penalty": scalars,
    "frequency_penalty": scalars,
    "repetition_penalty": scalars,
    "n": scalars,
    "stream": st.one_of(st.booleans(), scalars),
    "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": scalars}), scalars),
    "cache_salt": st.one_of(texts, scalars),
    "user": st.one_of(texts, scalars),
    "mlxd": st.one_of(st.fixed_dictionaries({"progress": scalars}), scalars),
    "unknown_field": anything,
}
model_names = st.one_of(st.just(MODEL), st.just(MODEL), texts, scalars, st.just(MODEL + ":nope"))
chat_bodies = st.fixed_dictionaries(
    {"model": model_names, "messages": st.one_of(st.lists(message, min_size=1, max_size=3), anything)},
    optional={**common, "tools": st.one_of(st.lists(st.fixed_dictionaries(
        {"type": st.just("function"), "function": st.fixed_dictionaries(
            {"name": texts}, optional={"parameters": anything, "description": texts})}), max_size=2), anything),
        "tool_choice": anything, "response_format": anything, "logprobs": scalars},
)
completion_bodies = st.fixed_dictionaries(
    {"model": model_names,
     "prompt": st.one_of(texts, st.lists(st.one_of(st.integers(-5, 60_000), st.sampled_from(HUGE_INTS)),
                                         max_size=30), st.lists(texts, max_size=3), anything)},
    optional={**common, "echo": scalars, "best_of": scalars, "suffix": anything},
)
# valid bodies with every knob at or near its limits: they must be served, not refused
plain_text = st.text(st.characters(codec="utf-8"), max_size=60)
valid_sampling = {
    "max_tokens": small_tokens,
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.001, 1),
    "top_k": st.one_of(st.integers(-1, 50), st.just(2**31 - 1)),
    "min_p": st.floats(0, 1),
    "seed": st.integers(-(2**63), 2**64 - 1),
    "stop": st.lists(plain_text, max_size=16),
    "logit_bias": st.dictionaries(st.integers(0, 49151).map(str), st.floats(-100, 100), max_size=3),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "repetition_penalty": st.floats(0.01, 5),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "cache_salt": plain_text,
}
valid_chat = st.fixed_dictionaries(
    {"model": st.just(MODEL), "messages": st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant"]), "content": plain_text}), min_size=1, max_size=3)},
    optional=valid_sampling)
valid_completion = st.fixed_dictionaries(
    {"model": st.just(MODEL), "prompt": st.one_of(plain_text.filter(bool), st.lists(st.integers(0, 49151),
                                                                                   min_size=1, max_size=40))},
    optional=valid_sampling)
requests = st.one_of(st.tuples(st.just("/v1/chat/completions"), chat_bodies),
                     st.tuples(st.just("/v1/completions"), completion_bodies),
                     st.tuples(st.just("/v1/chat/completions"), valid_chat),
                     st.tuples(st.just("/v1/completions"), valid_completion))


def check_answer(response: httpx.Response, body: dict) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:300], str(body)[:300])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and isinstance(error["message"], str)
        return
    text = response.text
    if response.headers["content-type"].startswith("text/event-stream"):
        # an error may end a stream only as a terminal event in the error shape
        events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
        assert all("error" not in e or set(e["error"]) >= {"message", "type"} for e in events)
        assert "error" in events[-1] or text.rstrip().endswith("data: [DONE]")
    else:
        answer = json.loads(text)
        assert answer["choices"][0]["finish_reason"] in ("stop", "length"), answer


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(request=requests)
def test_any_body_gets_a_well_formed_answer(svc: Service, request: tuple[str, dict]) -> None:
    path, body = request
    raw = to_wire(body)
    response = httpx.post(svc.base_url + path, content=raw, timeout=60,
                          headers={"content-type": "application/json"})
    event(f"{path} -> {response.status_code}")  # pytest --hypothesis-show-statistics shows the mix
    check_answer(response, body)


def test_the_service_still_serves_after_the_fuzzing(svc: Service) -> None:
    client = openai.OpenAI(base_url=f"{svc.base_url}/v1", api_key="unused", max_retries=0, timeout=60)
    reply = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=8,
                                           messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in (reply.choices[0].message.content or "")
    health = svc.health()
    assert health["status"] == "ok"
    (worker,) = health["workers"].values()
    assert worker["restarts"] == 0, "a fuzzed request crashed the worker"
    log = svc.log_text()
    for unforeseen in ("failed on admission", "failed during a step", "unhandled", "Traceback"):
        assert unforeseen not in log, f"a fuzzed request hit an unforeseen error path: {unforeseen}"
