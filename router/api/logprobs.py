"""OpenAI's logprobs: the request fields that ask for them, and the shapes they come back in.

Chat: `logprobs: true` and `top_logprobs` (0-20) -> `choices[].logprobs` =
`{content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}], refusal}`.
Text completions: `logprobs: n` (0-5) -> `{tokens, token_logprobs, top_logprobs,
text_offset}`, each `top_logprobs` entry a dict of the n most likely tokens plus the one
sampled; `text_offset` counts characters from the start of the completion (as vLLM's
without `echo`). A token that is part of a UTF-8 character is named `bytes:\\xNN...`.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from typing import Any

from protocol.messages import SamplingParams, TokenLogprobs
from router.validation import bad, flag, integer

MAX_CHAT_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5


def with_chat_logprobs(sampling: SamplingParams, body: dict[str, Any]) -> SamplingParams:
    """`sampling` with the chat fields `logprobs` and `top_logprobs` applied."""
    wanted = flag(body, "logprobs")
    top = integer(body, "top_logprobs", 0, MAX_CHAT_TOP_LOGPROBS) or 0
    if top and not wanted:
        raise bad("top_logprobs", "'top_logprobs' needs 'logprobs': true")
    sampling.logprobs, sampling.top_logprobs = wanted, top
    return sampling


def with_completion_logprobs(sampling: SamplingParams, body: dict[str, Any]) -> SamplingParams:
    """`sampling` with the completions field `logprobs` (how many alternatives) applied;
    `false`, as some clients send for "none", is taken as absent."""
    top = None if body.get("logprobs") is False else integer(body, "logprobs", 0, MAX_COMPLETION_LOGPROBS)
    sampling.logprobs, sampling.top_logprobs = top is not None, top or 0
    return sampling


def token_text(raw: bytes) -> str:
    """A token's text, or `bytes:\\xNN...` when its bytes are not whole UTF-8 characters."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{byte:02x}" for byte in raw)


def _entries(held: list[TokenLogprobs]) -> Iterator[tuple[bytes, float, list[bytes], list[float]]]:
    for figures in held:
        tops = figures.top_bytes or [[] for _ in figures.token_bytes]
        top_values = figures.top_logprobs or [[] for _ in figures.token_bytes]
        yield from zip(figures.token_bytes, figures.logprobs, tops, top_values)


class LogprobsFormatter:
    """Holds the figures of tokens not sent yet and formats them in the dialect's shape.

    A stream sends them with the next chunk that carries text (a token whose text the
    detokenizer or a stop string holds back still has its figures), or with the last.
    """

    def __init__(self, kind: str) -> None:
        self._kind = kind
        self._held: list[TokenLogprobs] = []
        self._offset = 0  # characters of completion text before the next token
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    @classmethod
    def for_request(cls, kind: str, sampling: SamplingParams) -> LogprobsFormatter | None:
        """A formatter if the request asked for logprobs, else None."""
        return cls(kind) if sampling.logprobs else None

    def add(self, figures: TokenLogprobs | None) -> None:
        if figures is not None and figures.token_bytes:
            self._held.append(figures)

    def take(self) -> dict[str, Any] | None:
        """The held figures as a choice's `logprobs` (None when none are held)."""
        if not self._held:
            return None
        held, self._held = self._held, []
        if self._kind == "chat":
            return {"content": [self._chat_entry(*entry) for entry in _entries(held)], "refusal": None}
        text: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for raw, value, top_bytes, top_values in _entries(held):
            text["tokens"].append(token_text(raw))
            text["token_logprobs"].append(value)
            alternatives = {token_text(b): v for b, v in zip(top_bytes, top_values)}
            alternatives.setdefault(token_text(raw), value)  # the sampled one is always there
            text["top_logprobs"].append(alternatives)
            text["text_offset"].append(self._offset)
            self._offset += len(self._decoder.decode(raw))
        return text

    @staticmethod
    def _chat_entry(raw: bytes, value: float, top_bytes: list[bytes], top_values: list[float]) -> dict[str, Any]:
        return {
            "token": token_text(raw), "logprob": value, "bytes": list(raw),
            "top_logprobs": [{"token": token_text(b), "logprob": v, "bytes": list(b)}
                             for b, v in zip(top_bytes, top_values)],
        }


def take_logprobs(formatter: LogprobsFormatter | None) -> dict[str, Any] | None:
    """`formatter.take()`, or None for a request that did not ask for logprobs."""
    return formatter.take() if formatter is not None else None
