"""The model's vocabulary as llguidance sees it (each token's bytes, which tokens are
special, EOS, the logits' width), built once per worker: grammars compile against it,
logprobs name tokens with it."""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import llguidance
from llguidance._tokenizer import TokenizerWrapper

log = logging.getLogger(__name__)


class _Tokens:
    """What llguidance's TokenizerWrapper reads: token bytes, special ids, an encoder."""

    def __init__(self, tokens: list[bytes], special_token_ids: list[int], eos_token_id: int,
                 backend: Any) -> None:
        self.tokens = tokens
        self.special_token_ids = special_token_ids
        self.eos_token_id = eos_token_id
        self.bos_token_id = None
        self._backend = backend

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):  # the wrapper probes with bytes once: we take text
            raise TypeError("text expected")
        return list(self._backend.encode(text, add_special_tokens=False).ids)


class TokenVocabulary:
    """llguidance's tokenizer for this model, built on first use.

    Building it walks the whole vocabulary (half a second for 49k tokens, two for 152k),
    so it is built lazily, by whichever thread needs it first (normally the tokenizer
    thread, admitting the first constrained or logprobs request), under a lock;
    afterwards it is read-only and shared. Its vocabulary spans the logits
    (`vocab_size`, which may exceed the tokenizer's own count: such padding ids are
    never allowed by a grammar) and its EOS tokens are the engine's, so a finished
    grammar allows exactly the tokens that end a sequence in the batch.

    Only tokens the tokenizer marks special are special to the grammar (`llg`).
    llguidance's own reading of a tokenizer.json (`llg_named`) treats every added token
    as special, so Qwen's `<tool_call>` (added, not special: the model writes it as
    text) could never match the text "<tool_call>" in a grammar, only a Lark token
    reference `<tool_call>`. Grammars compile against `llg` first and, if that fails,
    against `llg_named`: both spellings work.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: list[int]) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self._built: llguidance.LLTokenizer | None = None
        self._named: llguidance.LLTokenizer | None = None
        self._token_bytes: list[bytes] = []
        self._lock = threading.Lock()
        self._derived: dict[str, Any] = {}

    @property
    def llg(self) -> llguidance.LLTokenizer:
        """The llguidance tokenizer (built now if this is its first use)."""
        built = self._built
        if built is not None:
            return built
        with self._lock:
            if self._built is None:
                self._built = self._build()
            return self._built

    @property
    def llg_named(self) -> llguidance.LLTokenizer:
        """llguidance's default reading: every added token special (and named in Lark)."""
        self.llg  # noqa: B018  (built together)
        assert self._named is not None
        return self._named

    def _build(self) -> llguidance.LLTokenizer:
        started = time.perf_counter()
        # The public `backend_tokenizer` (mlx-lm's wrapper forwards it to the HF tokenizer),
        # copied so padding and truncation go off without touching the one the worker uses.
        backend = copy.copy(self._tokenizer.backend_tokenizer)
        backend.no_padding()
        backend.no_truncation()
        # llguidance decodes every token to its bytes (byte-level BPE, sentencepiece, ...)
        eos = self.eos_token_ids or None  # none known to the engine: the tokenizer's own
        decoder = llguidance.LLTokenizer(backend.to_str(), n_vocab=self.vocab_size, eos_token=eos)
        size = min(self.vocab_size, backend.get_vocab_size(with_added_tokens=True))
        tokens = [decoder.decode_bytes([i]) for i in range(size)] + [b""] * (self.vocab_size - size)
        special = sorted(i for i, added in self._tokenizer.added_tokens_decoder.items()
                         if added.special and i < self.vocab_size)
        eos_ids = self.eos_token_ids or [decoder.eos_token]
        built = llguidance.LLTokenizer(TokenizerWrapper(_Tokens(tokens, special, eos_ids[0], backend)),
                                       n_vocab=self.vocab_size, eos_token=eos_ids)
        self._token_bytes = tokens
        self._named = decoder
        log.info("grammar vocabulary built in %.2fs (%d tokens, %d special)", time.perf_counter() - started,
                 self.vocab_size, len(special))
        return built

    def token_bytes(self, token: int) -> bytes:
        """The bytes `token` stands for (a special token: its name, e.g. b"<|im_end|>")."""
        self.llg  # noqa: B018  (built on first use)
        return self._token_bytes[token] if 0 <= token < len(self._token_bytes) else b""

    def derived(self, key: str, build: Callable[[list[bytes]], Any]) -> Any:
        """`build(every token's bytes)`, computed once per vocabulary and kept under `key`:
        tables that walk the whole vocabulary (e.g. which tokens hold a character) are
        paid for once per worker, not per request."""
        found = self._derived.get(key)
        if found is None:
            self.llg  # noqa: B018  (the token bytes are built with it)
            with self._lock:
                found = self._derived.get(key)
                if found is None:
                    found = self._derived[key] = build(self._token_bytes)
        return found
