"""Constrained decoding in the engine (worker/grammar.py): the mask is exactly the
grammar, a finished grammar ends the request at EOS, and constrained and free sequences
share a batch without changing each other's tokens; on a tiny model with the real
tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import mlx.core as mx
import numpy as np
import pytest

from protocol.constraints import lark_json
from protocol.messages import (
    AddRequest,
    Constraint,
    ErrorEvent,
    FinishEvent,
    SamplingParams,
    TokenEvent,
)
from tests.worker.test_prefix_cache import Harness, chat
from tests.worker.tiny_models import make_tiny
from worker.grammar import GrammarCompiler, GrammarError, GrammarProcessor
from worker.vocabulary import TokenVocabulary

# Only enums, booleans and bounded choices: a random-weight model must finish it.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "green", "blue"]},
                   "size": {"anyOf": [{"enum": ["S", "M"]}, {"type": "null"}]}},
    "required": ["ok", "color", "size"], "additionalProperties": False,
}
CALL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"const": "get_weather"},
                   "arguments": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                                 "required": ["city"], "additionalProperties": False}},
    "required": ["name", "arguments"], "additionalProperties": False,
}
# what a forced tool call looks like: literal markup around JSON (in Qwen, "<tool_call>"
# is one added token; here, with SmolLM2's tokenizer, it is several)
TOOL_CALL = 'start: "<tool_call>\\n" call "\\n</tool_call>"\ncall: ' + lark_json(CALL_SCHEMA) + "\n"


@pytest.fixture(scope="module")
def tiny(default_model_dir: Path):
    return make_tiny("llama", default_model_dir)


@pytest.fixture(scope="module")
def vocabulary(tiny) -> TokenVocabulary:
    return TokenVocabulary(tiny.tokenizer, tiny.config["vocab_size"], sorted(tiny.tokenizer.eos_token_ids))


def submit(h: Harness, rid: str, messages: list[dict], constraint: Constraint | None, max_tokens: int = 60) -> str:
    h.engine.add(AddRequest(rid, messages=messages, constraint=constraint,
                            sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0)))
    return rid


def ask(h: Harness, rid: str, messages: list[dict], constraint: Constraint | None) -> tuple[list[int], str, FinishEvent]:
    submit(h, rid, messages, constraint)
    h.run()
    return answer(h, rid)


def answer(h: Harness, rid: str) -> tuple[list[int], str, FinishEvent]:
    ids, finish = h.result(rid)
    text = "".join(e.text for e in h.events if isinstance(e, TokenEvent) and e.request_id == rid)
    return ids, text, finish


def allowed_ids(processor: GrammarProcessor, context: list[int], width: int) -> set[int]:
    masked = processor(mx.array(context), mx.zeros((1, width)))
    return set(np.nonzero(np.isfinite(np.array(masked[0])))[0].tolist())


def test_the_mask_is_exactly_the_grammar_then_only_eos(vocabulary: TokenVocabulary) -> None:
    words = ('"yes"', '"no"')
    matcher = GrammarCompiler(vocabulary).compile(Constraint("json_schema", json.dumps({"enum": ["yes", "no"]})))
    processor = GrammarProcessor(matcher, 3, vocabulary)
    context, width = [11, 12, 13], vocabulary.vocab_size
    text = ""
    for _ in range(10):
        allowed = allowed_ids(processor, context, width)
        if text in words:
            assert allowed == set(vocabulary.eos_token_ids)  # complete: only EOS
            break
        for token in allowed:  # each allowed token keeps the text a prefix of an answer
            piece = text + vocabulary.token_bytes(token).decode("utf-8", "replace")
            assert any(word.startswith(piece) for word in words), repr(piece)
        token = min(allowed)
        text += vocabulary.token_bytes(token).decode()
        context.append(token)
    else:
        pytest.fail(f"the grammar never completed: {text!r}")
    assert processor.num_masks >= 2 and processor.seconds > 0


def test_a_refused_token_fails_the_request_not_the_step(vocabulary: TokenVocabulary) -> None:
    matcher = GrammarCompiler(vocabulary).compile(Constraint("json_object"))
    processor = GrammarProcessor(matcher, 1, vocabulary)
    allowed_ids(processor, [5], vocabulary.vocab_size)
    letter_a = vocabulary.llg.tokenize_str("a")[0]  # a JSON object cannot start with "a"
    assert allowed_ids(processor, [5, letter_a], vocabulary.vocab_size) == set(vocabulary.eos_token_ids)
    with pytest.raises(GrammarError, match="grammar engine stopped"):
        processor.check()


def test_constrained_and_free_requests_share_a_batch(tiny) -> None:
    constraint = Constraint("json_schema", json.dumps(SCHEMA))
    free_msgs, json_msgs = chat("What is topic 3?"), chat("Describe topic 4 as JSON.")
    alone = Harness(tiny, cache=False)
    free_alone = ask(alone, "f", free_msgs, None)
    json_alone = ask(alone, "c", json_msgs, constraint)
    together = Harness(tiny, cache=False)
    submit(together, "f", free_msgs, None)
    submit(together, "c", json_msgs, constraint)
    together.run()
    assert answer(together, "f")[0] == free_alone[0]
    ids, text, finish = answer(together, "c")
    assert ids == json_alone[0]
    assert finish.finish_reason == "stop"  # the grammar completed and allowed only EOS
    jsonschema.validate(json.loads(text), SCHEMA)
    assert finish.timings.grammar_s > 0


@pytest.mark.parametrize("fast_hit_path", [True, False])
def test_a_constrained_answer_from_a_cached_prefix_equals_scratch(tiny, fast_hit_path: bool) -> None:
    constraint = Constraint("json_schema", json.dumps(SCHEMA))
    messages = chat("Describe topic 8 as JSON.")
    expected = ask(Harness(tiny, cache=False), "c", messages, constraint)
    cached = Harness(tiny)
    if not fast_hit_path:
        cached.engine._hit_fast_path_open = lambda active: False
    submit(cached, "warm", messages, None, max_tokens=4)
    cached.run()
    ids, text, finish = ask(cached, "c", messages, constraint)
    assert finish.usage.cached_tokens > 0
    assert (ids, text, finish.finish_reason) == (expected[0], expected[1], expected[2].finish_reason)


def test_a_lark_grammar_forces_a_tool_call_with_json_arguments(tiny) -> None:
    h = Harness(tiny, cache=False)
    rid = submit(h, "t", chat("What is the weather in Paris?"), Constraint("lark", TOOL_CALL), max_tokens=80)
    h.run()
    _, text, finish = answer(h, rid)
    assert finish.finish_reason == "stop"
    assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>")
    call = json.loads(text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
    assert call["name"] == "get_weather" and call["arguments"]["city"] in ("Paris", "Rome")


def test_a_constraint_the_vocabulary_cannot_serve_is_refused_at_admission(tiny) -> None:
    h = Harness(tiny, cache=False)
    submit(h, "bad", chat("x"), Constraint("json_schema", json.dumps({"type": "string", "format": "nope"})))
    (error,) = [e for e in h.events if isinstance(e, ErrorEvent)]
    assert (error.status, error.param) == (400, "response_format") and "nope" in error.message
    assert not h.engine.has_work()



def test_a_batch_of_constrained_requests_gets_its_masks_in_one_pass(tiny, monkeypatch) -> None:
    """Masks applied to the whole step in the forward pass (worker/grammar_batch.py)
    give every sequence exactly its solo tokens; the counters show the batched path ran,
    and with it switched off (mlx-lm internals moved) the same tokens come from each
    processor alone."""
    requests = [("a", chat("Describe topic 1 as JSON."), Constraint("json_schema", json.dumps(SCHEMA))),
                ("b", chat("Describe topic 2 as JSON."), Constraint("json_schema", json.dumps(SCHEMA))),
                ("t", chat("What is the weather in Rome?"), Constraint("lark", TOOL_CALL)),
                ("f", chat("What is topic 5?"), None)]
    solo = {rid: ask(Harness(tiny, cache=False), rid, msgs, c)[:2] for rid, msgs, c in requests}

    def batched() -> tuple[dict[str, tuple[list[int], str]], list[GrammarProcessor]]:
        h = Harness(tiny, cache=False)
        grammars: list[GrammarProcessor] = []
        admit = h.engine._admitter.admit

        def recording(*args: Any) -> Any:
            admission = admit(*args)
            if admission.grammar is not None:
                grammars.append(admission.grammar)
            return admission
        h.engine._admitter.admit = recording
        for rid, msgs, c in requests:
            submit(h, rid, msgs, c)
        h.run()
        return {rid: answer(h, rid)[:2] for rid, _, _ in requests}, grammars

    together, grammars = batched()
    assert together == solo
    assert len(grammars) == 3 and all(g.num_masks >= 5 for g in grammars)
    # all but each sequence's first step (outside the running batch) were batched
    assert all(g.num_batched == g.num_masks - 1 for g in grammars), [(g.num_batched, g.num_masks) for g in grammars]

    monkeypatch.setattr("worker.grammar_batch.take_processors", lambda generator, select: [])
    alone, grammars = batched()
    assert alone == solo and all(g.num_batched == 0 for g in grammars)
