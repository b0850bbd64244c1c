"""The lazy call grammar of `tool_choice: auto` in the engine (worker/lazy_grammar.py):
free text passes untouched, a call is held to the tools from its opener on, the budget
never cuts a call, and a lazy request changes no other request in its batch. On a tiny
random model with Qwen2.5-Coder's real tokenizer, where `<tool_call>` is one token, so a
`logit_bias` can make even a random model open calls; a second bias pulls it toward an
enum value the tool does not allow."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import mlx.core as mx
import numpy as np
import pytest

from protocol.messages import AddRequest, Constraint, SamplingParams, TokenEvent
from router.tool_calls.lazy_grammar import lazy_call_constraint
from router.tool_calls.request import ToolRequest, ToolSpec
from tests.worker.test_prefix_cache import Harness
from tests.worker.tiny_models import make_tiny
from worker import call_budget
from worker.grammar import FREE, GrammarCompiler
from worker.lazy_grammar import LazyCallProcessor, TriggerWatch
from worker.reasoning_span import ReasoningSpan
from worker.vocabulary import TokenVocabulary

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
                                            "unit": {"type": "string", "enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = ToolRequest((ToolSpec("get_weather", WEATHER), ToolSpec("get_time", {
    "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
    "required": ["zone"], "additionalProperties": False})))
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


@pytest.fixture(scope="module")
def tiny(qwen_model_dir: Path):
    from mlx_lm.utils import load_tokenizer

    return make_tiny("llama", qwen_model_dir, vocab_size=len(load_tokenizer(qwen_model_dir)._tokenizer))


@pytest.fixture(scope="module")
def vocabulary(tiny) -> TokenVocabulary:
    return TokenVocabulary(tiny.tokenizer, tiny.config["vocab_size"], sorted(tiny.tokenizer.eos_token_ids))


def token(tiny, text: str) -> int:
    (only,) = tiny.tokenizer.encode(text, add_special_tokens=False)
    return only


@pytest.fixture(scope="module")
def engine(tiny) -> Harness:
    """One engine for the module: its grammar vocabulary (152k tokens) is built once."""
    return Harness(tiny, cache=False)


def run(h: Harness, constraint: Constraint | None, bias: dict[int, float], max_tokens: int,
        others: int = 0) -> tuple[str, list[str]]:
    """The lazy request's text, and that of `others` free requests decoded beside it."""
    h.events.clear()
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, logit_bias=bias)
    h.engine.add(AddRequest("lazy", messages=MESSAGES, constraint=constraint, sampling=sampling))
    for i in range(others):
        h.engine.add(AddRequest(f"free{i}", messages=[{"role": "user", "content": f"Count to {i + 3}."}],
                                sampling=SamplingParams(max_tokens=24, temperature=0.0)))
    h.run()

    def text(rid: str) -> str:
        return "".join(e.text for e in h.events if isinstance(e, TokenEvent) and e.request_id == rid)
    return text("lazy"), [text(f"free{i}") for i in range(others)]


def calls_in(text: str) -> list[dict[str, Any]]:
    return [json.loads(body) for body in CALL.findall(text)]


def broken_calls(text: str) -> int:
    """Openers not followed by a whole, schema-valid call."""
    return text.count("<tool_call>") - sum(valid(call) for call in calls_in(text))


def valid(call: dict[str, Any]) -> bool:
    schemas = {tool.name: tool.parameters for tool in TOOLS.tools}
    if set(call) != {"name", "arguments"} or call["name"] not in schemas:
        return False
    try:
        jsonschema.validate(call["arguments"], schemas[call["name"]])
    except jsonschema.ValidationError:
        return False
    return True


def test_the_watch_finds_triggers_across_tokens_and_only_at_the_start_where_asked() -> None:
    constraint = lazy_call_constraint("hermes", TOOLS)
    watch = TriggerWatch(constraint)
    assert [watch.see(piece) for piece in (b"Sure, <to", b"ol_ca", b"ll>\n{")] == [None, None, b"<tool_call>\n{"]
    watch = TriggerWatch(constraint)
    assert [watch.see(piece) for piece in (b"  {\"", b"name", b"\": \"g")] == [None, None, b'{"name": "g']
    watch = TriggerWatch(constraint)
    assert watch.see(b"Here: ") is None and watch.see(b'{"name": "x"') is None  # bare only where the answer starts
    marker = TriggerWatch(lazy_call_constraint("mistral", TOOLS))
    assert marker.see(b"[TOOL_CALLS]") == b""  # the grammar starts after a marker


def test_free_text_passes_untouched_and_a_begun_call_holds_to_the_enum(tiny, vocabulary: TokenVocabulary) -> None:
    constraint = lazy_call_constraint("hermes", TOOLS)
    matcher = GrammarCompiler(vocabulary).compile(constraint)
    processor = LazyCallProcessor(matcher, constraint, 3, 500, vocabulary)
    width = tiny.config["vocab_size"]
    logits = mx.arange(width, dtype=mx.float32)[None]
    prompt = [1, 2, 3]
    free = tiny.tokenizer.encode("Sure, let me check.", add_special_tokens=False)
    assert processor.allowed(None) is FREE
    assert processor(mx.array(prompt + free), logits) is logits  # not even a copy
    begun = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "'
    context = prompt + free + tiny.tokenizer.encode(begun, add_special_tokens=False)
    masked = np.array(processor(mx.array(context), logits)[0])
    allowed = {tiny.tokenizer.decode([i]) for i in np.flatnonzero(np.isfinite(masked))}
    assert allowed and all(text[:1] in ("c", "f") for text in allowed), sorted(allowed)[:20]


def test_a_call_opener_inside_the_reasoning_span_is_reasoning(tiny, vocabulary: TokenVocabulary) -> None:
    """The router reads calls only after the span: one the model writes while thinking is
    left free, and the first after the span's close is held."""
    constraint = lazy_call_constraint("hermes", TOOLS)
    width = tiny.config["vocab_size"]
    logits = mx.arange(width, dtype=mx.float32)[None]
    prompt = [1, 2, 3]
    thought = tiny.tokenizer.encode('I could write <tool_call>\n{"name": "get_weather", "arguments": {"unit": "',
                                    add_special_tokens=False)
    answer = tiny.tokenizer.encode('</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
                                   '"unit": "',
                                   add_special_tokens=False)

    def processor(span: ReasoningSpan | None) -> LazyCallProcessor:
        return LazyCallProcessor(GrammarCompiler(vocabulary).compile(constraint), constraint, 3, 500, vocabulary,
                                 span=span)

    unaware = processor(None)
    assert unaware(mx.array(prompt + thought), logits) is not logits  # the control: taken as a call
    thinking = processor(ReasoningSpan("<think>", "</think>", True))
    assert thinking(mx.array(prompt + thought), logits) is logits
    assert thinking.free_ahead(answer) == answer.index(token(tiny, "<tool_call>"))  # drafts stop at the call
    masked = np.array(thinking(mx.array(prompt + thought + answer), logits)[0])
    allowed = {tiny.tokenizer.decode([i]) for i in np.flatnonzero(np.isfinite(masked))}
    assert allowed and all(text[:1] in ("c", "f") for text in allowed), sorted(allowed)[:20]


@pytest.mark.parametrize("max_tokens", [60])
def test_a_model_pulled_toward_a_wrong_enum_still_writes_only_valid_calls(tiny, engine: Harness, max_tokens: int) -> None:
    bias = {token(tiny, "<tool_call>"): 40.0, token(tiny, "cel"): 30.0, token(tiny, "Berlin"): 30.0}
    free, _ = run(engine, None, bias, max_tokens)
    assert broken_calls(free) > 0, free  # the control: free, the model's calls break
    held, _ = run(engine, lazy_call_constraint("hermes", TOOLS), bias, max_tokens)
    assert "<tool_call>" in held and broken_calls(held) == 0, held


def test_no_budget_cuts_a_call(tiny, engine: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """Budgets from 1 to 40 tokens (a call here takes 20-25), the model pulled into calls
    at every turn: the answer holds only whole calls (one that could not finish is never
    opened, one begun is closed in time)."""
    bias = {token(tiny, "<tool_call>"): 40.0, token(tiny, "cel"): 30.0}
    constraint = lazy_call_constraint("hermes", TOOLS)

    def cut(text: str) -> bool:
        return text.count("<tool_call>") != text.count("</tool_call>")
    budgets = range(1, 41, 3)
    assert not [n for n in budgets if cut(run(engine, constraint, bias, n)[0])]
    monkeypatch.setattr("worker.lazy_grammar.ZONE", 0)  # the control: no budget guard
    assert [n for n in budgets if cut(run(engine, constraint, bias, n)[0])]


def test_a_lazy_request_changes_no_token_of_the_free_requests_beside_it(tiny, engine: Harness) -> None:
    bias = {token(tiny, "<tool_call>"): 40.0}
    _, alone = run(engine, None, {}, 40, others=3)
    held, beside = run(engine, lazy_call_constraint("hermes", TOOLS), bias, 40, others=3)
    assert calls_in(held) and beside == alone


def test_the_shortest_completion_closes_an_open_call(tiny, vocabulary: TokenVocabulary) -> None:
    constraint = lazy_call_constraint("hermes", TOOLS)
    matcher = GrammarCompiler(vocabulary).compile(constraint)
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
    matcher.consume_tokens(vocabulary.llg.tokenize_str(text))
    quotes = call_budget.JsonQuotes()
    quotes.feed(text.encode())
    path = call_budget.shortest_completion(matcher, quotes, vocabulary)
    assert path is not None and len(path) <= 12
    finished = text + tiny.tokenizer.decode(path)
    assert valid(calls_in(finished)[0]), finished


FORECAST = ToolRequest((ToolSpec("get_forecast", {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]},
                                     "days": {"type": "integer"}},
    "required": ["city", "unit", "days"], "additionalProperties": False}),))


def test_a_call_may_write_its_arguments_in_the_order_the_tool_declares_them(vocabulary: TokenVocabulary) -> None:
    """The grammar holds an object's properties to the schema's order; that must be the
    order the tool declared (the one the model saw in its prompt), not an alphabetical one."""
    matcher = GrammarCompiler(vocabulary).compile(lazy_call_constraint("hermes", FORECAST))
    text = '<tool_call>\n{"name": "get_forecast", "arguments": {"city": "Paris", "unit": "c", "days": 3}}\n</tool_call>'
    assert matcher.consume_tokens(vocabulary.llg.tokenize_str(text)), matcher.get_error()
    assert matcher.is_accepting()


@pytest.mark.parametrize("written", ['{"city": "Par', '{"city": "Paris", "unit": "c", "days": 1'])
def test_the_shortest_completion_ends_a_number(tiny, vocabulary: TokenVocabulary, written: str) -> None:
    """An integer may grow forever: a walk that preferred its digits to what follows
    found no way out within the zone, so such a call could not be closed in time."""
    matcher = GrammarCompiler(vocabulary).compile(lazy_call_constraint("hermes", FORECAST))
    text = '<tool_call>\n{"name": "get_forecast", "arguments": ' + written
    assert matcher.consume_tokens(vocabulary.llg.tokenize_str(text)), matcher.get_error()
    quotes = call_budget.JsonQuotes()
    quotes.feed(text.encode())
    path = call_budget.shortest_completion(matcher, quotes, vocabulary)
    assert path is not None and len(path) <= 16, path
    (call,) = calls_in(text + tiny.tokenizer.decode(path))
    jsonschema.validate(call["arguments"], FORECAST.tools[0].parameters)


@pytest.mark.parametrize("written", ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa',
                                     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", ',
                                     '<tool_call>\n{"name": "get_for', '<tool_call>\n{"name": "get_forecast", '
                                     '"arguments": {"city": "Paris", "unit": "c", "days": 1'])
def test_the_walk_picks_what_a_sort_of_the_allowed_tokens_picks(vocabulary: TokenVocabulary, written: str) -> None:
    """The walk finds its token as the first allowed one of a preference order built once;
    it must be the token a sort of that step's allowed tokens (the definition) picks."""
    tools = ToolRequest(TOOLS.tools + FORECAST.tools)
    matcher = GrammarCompiler(vocabulary).compile(lazy_call_constraint("hermes", tools))
    assert matcher.consume_tokens(vocabulary.llg.tokenize_str(written)), matcher.get_error()
    quotes = call_budget.JsonQuotes()
    quotes.feed(written.encode())
    shapes = call_budget.token_shapes(vocabulary)
    words = np.zeros((vocabulary.vocab_size + 31) // 32, dtype=np.int32)
    for _ in range(6):  # this state, and the walk's next few
        matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        bits = np.unpackbits(words.view(np.uint8), bitorder="little", count=vocabulary.vocab_size)
        ids = np.flatnonzero(bits)
        ids = ids[~np.isin(ids, vocabulary.eos_token_ids)]
        if quotes.in_string and not quotes.escaped and (shapes.first[ids] == call_budget.QUOTE).any():
            ids = ids[shapes.first[ids] == call_budget.QUOTE]
        expected = int(ids[np.lexsort((ids, shapes.lengths[ids], shapes.closing[ids]))[-1]])
        (path_first, *_) = call_budget.shortest_completion(matcher, quotes, vocabulary)
        assert path_first == expected, (vocabulary.token_bytes(path_first), vocabulary.token_bytes(expected))
        matcher.consume_token(expected)
        quotes.feed(vocabulary.token_bytes(expected))
        if matcher.is_accepting():
            break


def test_a_call_that_follows_its_shortest_completion_is_walked_once(tiny, vocabulary: TokenVocabulary,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Near the budget's end a call's shortest completion is walked (a mask per token of
    it); while the answer follows it, or is forced along it, it stays known, and the
    walk the budget guard made from the call's opener serves the call's first step."""
    constraint = lazy_call_constraint("hermes", TOOLS)
    compiler = GrammarCompiler(vocabulary)
    opener = token(tiny, "<tool_call>")
    reference = compiler.compile(constraint)
    reference.consume_token(opener)
    quotes = call_budget.JsonQuotes()
    quotes.feed(b"<tool_call>")
    path = call_budget.shortest_completion(reference, quotes, vocabulary)
    assert path

    walks: list[int] = []
    real_walk = call_budget.shortest_completion

    def counted(*args: Any, **kwargs: Any) -> list[int] | None:
        walks.append(1)
        return real_walk(*args, **kwargs)

    def answer(deviate_at: int | None) -> str:
        budget = 1 + len(path) + call_budget.MARGIN + 1  # the opener fits, and the call barely does
        processor = LazyCallProcessor(compiler.compile(constraint), constraint, 0, budget, vocabulary)
        words = np.zeros((vocabulary.vocab_size + 31) // 32, dtype=np.int32)
        assert processor.allowed(None)[opener]  # the guard: a whole call still fits
        monkeypatch.setattr("worker.lazy_grammar.shortest_completion", counted)
        walks.clear()
        processor.consume([opener])
        written = [opener]
        for step in range(budget):
            allowed = processor.allowed(words if processor.mask_into(words) else None)
            want = path[step] if step < len(path) else vocabulary.eos_token_ids[0]
            if step == deviate_at:  # the control: a token of the model's own, off the walk
                want = next(t for t in np.flatnonzero(allowed) if t != want and t not in vocabulary.eos_token_ids)
            assert allowed[want]
            if want in vocabulary.eos_token_ids:
                break
            processor.consume([int(want)])
            written.append(int(want))
        monkeypatch.setattr("worker.lazy_grammar.shortest_completion", real_walk)
        return tiny.tokenizer.decode(written)

    text = answer(deviate_at=None)
    assert walks == [] and valid(calls_in(text)[0]), text
    deviating = next(i for i, t in enumerate(path) if vocabulary.token_bytes(t).startswith(b'"') and i > 4)
    answer(deviate_at=deviating)
    assert walks  # leaving the walk means walking again


def test_speculation_drafts_only_as_far_as_no_mask_is_needed(tiny, vocabulary: TokenVocabulary) -> None:
    """`free_ahead`: free text may be drafted up to the token that completes a trigger
    (that token's successor needs the call grammar's mask) or reaches the budget's zone;
    inside a call, nothing; and looking ahead leaves the processor as it was."""
    constraint = lazy_call_constraint("hermes", TOOLS)
    matcher = GrammarCompiler(vocabulary).compile(constraint)
    free = tiny.tokenizer.encode("Sure, let me check the weather.", add_special_tokens=False)
    opener = tiny.tokenizer.encode("<tool_call>", add_special_tokens=False)
    processor = LazyCallProcessor(matcher, constraint, 3, 500, vocabulary)
    assert processor.free_ahead(free) == len(free)
    assert processor.free_ahead(free + opener + free) == len(free) + len(opener) - 1
    assert processor.free_ahead(free) == len(free)  # the look ahead changed nothing
    near_end = LazyCallProcessor(matcher.deep_copy(), constraint, 3, call_budget.ZONE + 4, vocabulary)
    assert near_end.free_ahead(free) == 3  # the fourth token's successor is inside the zone
    processor.consume(free + opener)
    assert processor.free_ahead(free) == 0  # inside the call: every token is held
