"""Incremental detokenization that always agrees with `tokenizer.decode`.

Streamed text must concatenate to exactly the non-streamed text. Decoding a sliding
window of ids and emitting only the stable part (no dangling U+FFFD from a split
multi-byte character) gives that for any HF tokenizer, byte-level BPE or SentencePiece.
"""

from __future__ import annotations

from typing import Any

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Turns one request's generated ids into text deltas.

    Invariant: the concatenation of every `add` result plus `flush` equals
    `tokenizer.decode(all_ids, skip_special_tokens=True)` up to tokenizer quirks at
    window boundaries (which the prefix window makes vanish in practice).
    """

    def __init__(self, tokenizer: Any, prompt_tail: list[int] | None = None) -> None:
        self._tokenizer = tokenizer
        # A few prompt ids as context so the first token's leading-space handling
        # matches a decode of the whole sequence (SentencePiece drops it otherwise).
        self._ids: list[int] = list(prompt_tail or [])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, token_id: int) -> str:
        """New text made final by this token ('' while a character is incomplete)."""
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith(_REPLACEMENT):
            delta = new_text[len(prefix_text) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            return delta
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end)."""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]
