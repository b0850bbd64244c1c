"""A draft must share the target's vocabulary: refused at load, naming what differs."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from worker.drafted_model import DraftMismatch, check_same_vocabulary


def loaded(vocab: dict[str, int], vocab_size: int | None = None) -> Any:
    tokenizer = SimpleNamespace(get_vocab=lambda: dict(vocab))
    return SimpleNamespace(tokenizer=tokenizer, config={"vocab_size": vocab_size or len(vocab)})


VOCAB = {"a": 0, "b": 1, "<eos>": 2}


def test_the_same_vocabulary_drafts() -> None:
    check_same_vocabulary(loaded(VOCAB), loaded(VOCAB))
    check_same_vocabulary(loaded(VOCAB, 8), loaded(VOCAB, 8))


@pytest.mark.parametrize(("draft", "words"), [
    (loaded({"a": 0, "c": 1, "<eos>": 2}), "vocabulary differs"),  # another token at an id
    (loaded({"a": 1, "b": 0, "<eos>": 2}), "vocabulary differs"),  # the same tokens, other ids
    (loaded({"a": 0, "b": 1}), "vocabulary differs"),  # fewer tokens
    (loaded(VOCAB, 2), "must score every token"),  # a head narrower than the target's ids
])
def test_a_draft_of_another_vocabulary_is_refused(draft: Any, words: str) -> None:
    with pytest.raises(DraftMismatch) as err:
        check_same_vocabulary(loaded(VOCAB, 4), draft)
    assert words in str(err.value)
