"""worker/vocabulary.py: token bytes, and which tokens a grammar treats as special, on the
real tokenizers (SmolLM2's, and Qwen's whose tool-call markers are added, non-special
tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from mlx_lm.utils import load_tokenizer

from protocol.constraints import lark_json
from protocol.messages import Constraint
from worker.grammar import GrammarCompiler
from worker.vocabulary import TokenVocabulary

CALL = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL_CALL = 'start: "<tool_call>\\n" ' + lark_json(CALL) + ' "\\n</tool_call>"'


def vocabulary_of(model_dir: Path) -> tuple[TokenVocabulary, object]:
    tokenizer = load_tokenizer(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    return TokenVocabulary(tokenizer, config["vocab_size"], sorted(tokenizer.eos_token_ids)), tokenizer


def allowed(matcher, vocabulary: TokenVocabulary) -> set[int]:
    words = np.zeros((vocabulary.vocab_size + 31) // 32, dtype=np.int32)
    matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
    return set(np.nonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))[0].tolist())


def test_token_bytes_and_special_tokens(default_model_dir: Path) -> None:
    vocabulary, tokenizer = vocabulary_of(default_model_dir)
    (hello,) = tokenizer.encode(" hello", add_special_tokens=False)
    assert vocabulary.token_bytes(hello) == b" hello"
    (eos,) = vocabulary.eos_token_ids
    assert vocabulary.token_bytes(eos) == b"<|im_end|>" and vocabulary.llg.is_special_token(eos)
    assert vocabulary.token_bytes(vocabulary.vocab_size) == b""  # past the vocabulary: nothing


def test_an_added_non_special_token_matches_its_text_in_a_grammar(qwen_model_dir: Path) -> None:
    """Qwen writes `<tool_call>` as one added token that is not special: a grammar saying
    "<tool_call>\\n" must accept it (and its EOS stays special, allowed only at the end)."""
    vocabulary, tokenizer = vocabulary_of(qwen_model_dir)
    marker = tokenizer.convert_tokens_to_ids("<tool_call>")
    assert not vocabulary.llg.is_special_token(marker)
    assert all(vocabulary.llg.is_special_token(t) for t in vocabulary.eos_token_ids)
    matcher = GrammarCompiler(vocabulary).compile(Constraint("lark", TOOL_CALL))
    assert marker in allowed(matcher, vocabulary)
    tokens = tokenizer.encode('<tool_call>\n{"city": "Paris"}\n</tool_call>', add_special_tokens=False)
    assert tokens[0] == marker
    for token in tokens:
        assert token in allowed(matcher, vocabulary)
        assert matcher.consume_token(token), matcher.get_error()
    assert allowed(matcher, vocabulary) == set(vocabulary.eos_token_ids)


def test_a_grammar_may_name_an_added_token_instead(qwen_model_dir: Path) -> None:
    vocabulary, tokenizer = vocabulary_of(qwen_model_dir)
    named = TOOL_CALL.replace('"<tool_call>\\n"', '<tool_call> "\\n"').replace('"\\n</tool_call>"', '"\\n" </tool_call>')
    assert named != TOOL_CALL
    matcher = GrammarCompiler(vocabulary).compile(Constraint("lark", named))
    tokens = tokenizer.encode('<tool_call>\n{"city": "Paris"}\n</tool_call>', add_special_tokens=False)
    assert all(matcher.consume_token(token) for token in tokens), matcher.get_error()
    assert allowed(matcher, vocabulary) == set(vocabulary.eos_token_ids)


def test_a_call_without_its_marker_is_refused(default_model_dir: Path) -> None:
    vocabulary, tokenizer = vocabulary_of(default_model_dir)
    matcher = GrammarCompiler(vocabulary).compile(Constraint("lark", TOOL_CALL))
    (first, *_) = tokenizer.encode('{"city": "Rome"}', add_special_tokens=False)
    assert first not in allowed(matcher, vocabulary)  # the call must open with its marker
