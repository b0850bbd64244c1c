"""router.tool_calls.grammar: the forced-call grammars are valid llguidance Lark, accept
the call each dialect's parser reads back, and refuse anything else."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llguidance
import pytest
import tokenizers

from protocol.tool_dialects import HERMES, LLAMA3_JSON, MISTRAL, MLXD, TOOL_DIALECTS
from router.tool_calls import FUNCTION, REQUIRED, ToolCallParser, ToolRequest, ToolSpec, dialect_named, gather
from router.tool_calls.grammar import forced_call_grammar

WEATHER = ToolSpec("get_weather", {"type": "object", "properties": {"city": {"type": "string"},
                                                                   "days": {"type": "integer", "minimum": 1}},
                                   "required": ["city"], "additionalProperties": False})
READ = ToolSpec("read_file", None)
TOOLS = (WEATHER, READ)


class Vocabulary:
    """A model's tokenizer twice: as llguidance sees it, and to encode text the way the
    model writes it (a tag that is a token of its own comes out as that one token)."""

    def __init__(self, tokenizer_json: str) -> None:
        self.llg = llguidance.LLTokenizer(tokenizer_json)
        self.hf = tokenizers.Tokenizer.from_str(tokenizer_json)

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids


@pytest.fixture(scope="module")
def vocabularies(default_model_dir: Path) -> dict[str, Vocabulary]:
    """Per dialect: SmolLM2's vocabulary, and for Hermes the same with the two tags added
    as tokens, as Qwen's has them (ids after the vocabulary, not marked special)."""
    plain = json.loads((default_model_dir / "tokenizer.json").read_text())
    tagged = json.loads(json.dumps(plain))
    size = len(tagged["model"]["vocab"])
    tagged["added_tokens"] += [{"id": size + i, "content": tag, "single_word": False, "lstrip": False,
                                "rstrip": False, "normalized": False, "special": False}
                               for i, tag in enumerate(("<tool_call>", "</tool_call>"))]
    smol = Vocabulary(json.dumps(plain))
    return {dialect: Vocabulary(json.dumps(tagged)) if dialect == HERMES else smol for dialect in TOOL_DIALECTS}


def call_text(dialect: str, calls: list[tuple[str, dict[str, Any]]]) -> str:
    """The answer text a model writes for `calls` in `dialect`, laid out as json.dumps does."""
    if dialect in (HERMES, MLXD):
        return "\n".join(f'<tool_call>\n{json.dumps({"name": n, "arguments": a})}\n</tool_call>' for n, a in calls)
    if dialect == LLAMA3_JSON:
        return "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in calls)
    return json.dumps([{"name": n, "arguments": a} for n, a in calls])


def accepts(vocabulary: Vocabulary, grammar: str, text: str) -> bool:
    matcher = llguidance.LLMatcher(vocabulary.llg, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    return matcher.consume_tokens(vocabulary.encode(text)) and matcher.is_accepting()


@pytest.mark.parametrize("dialect", TOOL_DIALECTS)
@pytest.mark.parametrize("choice, function, parallel", [
    (REQUIRED, None, True), (REQUIRED, None, False), (FUNCTION, "get_weather", True), (FUNCTION, "read_file", False),
])
def test_grammars_are_valid(vocabularies: dict[str, Vocabulary], dialect: str, choice: str, function: str | None,
                            parallel: bool) -> None:
    grammar = forced_call_grammar(dialect, ToolRequest(TOOLS, choice, function, parallel))
    error = llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(grammar),
                                                  vocabularies[dialect].llg)
    assert error == "", error


@pytest.mark.parametrize("dialect", TOOL_DIALECTS)
def test_a_named_choice_accepts_exactly_a_call_of_that_function(vocabularies: dict[str, Vocabulary],
                                                                dialect: str) -> None:
    tokenizer = vocabularies[dialect]
    grammar = forced_call_grammar(dialect, ToolRequest(TOOLS, FUNCTION, "get_weather"))
    good = [("get_weather", {"city": "Paris"})]
    assert accepts(tokenizer, grammar, call_text(dialect, good))
    assert accepts(tokenizer, grammar, call_text(dialect, [("get_weather", {"city": "Oslo", "days": 3})]))
    if dialect in (HERMES, MLXD):  # the newline after </tool_call> that a model may write before it stops
        assert accepts(tokenizer, grammar, call_text(dialect, good) + "\n")
    # the parser reads back exactly the call the grammar let through
    parser = ToolCallParser(dialect_named(dialect), {"get_weather", "read_file"})
    _, calls = gather(parser.feed(call_text(dialect, good)) + parser.finish())
    assert [(c.name, json.loads(c.arguments)) for c in calls] == good
    for bad in ([("read_file", {})],  # another function
                [("get_weather", {})],  # a required argument missing
                [("get_weather", {"city": "Paris", "x": 1})],  # an argument the schema forbids
                [("get_weather", {"city": "Paris", "days": 0})],  # out of range
                [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]):  # a second call
        assert not accepts(tokenizer, grammar, call_text(dialect, bad)), bad
    assert not accepts(tokenizer, grammar, "The weather in Paris is sunny.")
    assert not accepts(tokenizer, grammar, call_text(dialect, good).replace('": ', '":  '))  # padding


@pytest.mark.parametrize("dialect", TOOL_DIALECTS)
@pytest.mark.parametrize("parallel", [True, False])
def test_required_accepts_one_call_of_any_offered_function(vocabularies: dict[str, Vocabulary], dialect: str,
                                                           parallel: bool) -> None:
    """One call, even with parallel calls allowed: let write another after each, SmolLM2
    keeps calling until its tokens run out."""
    tokenizer = vocabularies[dialect]
    two = [("read_file", {"path": "a.txt"}), ("get_weather", {"city": "Paris"})]
    grammar = forced_call_grammar(dialect, ToolRequest(TOOLS, REQUIRED, None, parallel=parallel))
    assert accepts(tokenizer, grammar, call_text(dialect, two[:1]))
    assert accepts(tokenizer, grammar, call_text(dialect, two[1:]))
    assert not accepts(tokenizer, grammar, call_text(dialect, two))
    assert not accepts(tokenizer, grammar, call_text(dialect, [("write_file", {})]))


def test_auto_forces_nothing() -> None:
    with pytest.raises(ValueError):
        forced_call_grammar(HERMES, ToolRequest(TOOLS))
    assert not ToolRequest(TOOLS).forces_call and ToolRequest(TOOLS, REQUIRED).forces_call


def test_mistral_grammar_needs_no_special_token() -> None:
    """[TOOL_CALLS] is a special token whose id the router does not know: the grammar
    forces the array after it, which the parser reads bare."""
    assert "TOOL_CALLS" not in forced_call_grammar(MISTRAL, ToolRequest(TOOLS, REQUIRED))


def test_definitions_of_a_pydantic_schema_still_resolve(vocabularies: dict[str, Vocabulary]) -> None:
    """Schemas from pydantic (LangChain, the SDK's pydantic_function_tool) reference their
    `$defs` from their own root, which inside the call schema is not the root any more."""
    city = {"type": "object", "properties": {"name": {"type": "string"}, "country": {"$ref": "#/$defs/Country"}},
            "required": ["name", "country"], "additionalProperties": False}
    trip = ToolSpec("plan_trip", {
        "type": "object", "properties": {"to": {"$ref": "#/$defs/City"}}, "required": ["to"],
        "additionalProperties": False,
        "$defs": {"City": city, "Country": {"enum": ["FR", "IT"]}}})
    other = ToolSpec("other", {"type": "object", "$defs": {"City": {"type": "integer"}},
                               "properties": {"c": {"$ref": "#/$defs/City"}}, "required": ["c"]})
    for dialect in TOOL_DIALECTS:
        tokenizer = vocabularies[dialect]
        grammar = forced_call_grammar(dialect, ToolRequest((trip, other), REQUIRED))
        assert accepts(tokenizer, grammar, call_text(dialect, [("plan_trip", {"to": {"name": "Paris",
                                                                                      "country": "FR"}})])), dialect
        assert accepts(tokenizer, grammar, call_text(dialect, [("other", {"c": 3})])), dialect
        assert not accepts(tokenizer, grammar, call_text(dialect, [("plan_trip", {"to": {"name": "Paris",
                                                                                          "country": "DE"}})]))
        assert not accepts(tokenizer, grammar, call_text(dialect, [("other", {"c": "Paris"})]))


def test_hermes_tags_are_the_tokens_the_model_writes(vocabularies: dict[str, Vocabulary]) -> None:
    """Qwen writes <tool_call> as one token; llguidance will not let the grammar spell it
    with others. mlxd's fallback spells the tags, in any vocabulary."""
    good = call_text(HERMES, [("get_weather", {"city": "Paris"})])
    hermes = forced_call_grammar(HERMES, ToolRequest(TOOLS, FUNCTION, "get_weather"))
    assert vocabularies[HERMES].encode("<tool_call>") == [len(vocabularies[MLXD].hf.get_vocab())]
    assert accepts(vocabularies[HERMES], hermes, good)
    assert accepts(vocabularies[MLXD], forced_call_grammar(MLXD, ToolRequest(TOOLS, FUNCTION, "get_weather")), good)
    assert llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(hermes),
                                                 vocabularies[MLXD].llg) != ""  # no such token there
