"""A prompt that cannot fit the context window, told without tokenizing it.

No token covers more characters than the vocabulary's longest token string, so a text of
N characters is at least N / `max_token_chars` tokens. The router applies this before it
forwards a request and the worker before it tokenizes one, with one rule and one message.
"""

from __future__ import annotations

from protocol.errors import RequestError
from protocol.messages import AddRequest


def prompt_chars(add: AddRequest) -> int:
    """Characters of the request's own text (message contents or the prompt string),
    which the rendered prompt holds at least once; token-id prompts count 0."""
    if add.messages is not None:
        return sum(len(m["content"]) for m in add.messages if isinstance(m.get("content"), str))
    return len(add.prompt) if isinstance(add.prompt, str) else 0


def context_error(add: AddRequest, min_tokens: int, window: int, detail: str = "") -> RequestError:
    """The 400 for a prompt of at least `min_tokens` tokens against a `window`-token context."""
    return RequestError(
        f"prompt is {'at least ' if detail else ''}{min_tokens} tokens{detail}, but this model's context window "
        f"is {window} tokens (prompt + completion must fit); shorten the prompt",
        param="messages" if add.messages is not None else "prompt", code="context_length_exceeded",
        num_prompt_tokens=min_tokens, context_window=window)


def check_prompt_fits(add: AddRequest, window: int, max_token_chars: int) -> None:
    """Raise the context-length 400 if the prompt's text or ids alone leave no room for an
    answer in `window` tokens (`max_token_chars` 0: unknown, text is not checked)."""
    if isinstance(add.prompt, list) and len(add.prompt) >= window:
        raise context_error(add, len(add.prompt), window)
    if max_token_chars > 0:
        chars = prompt_chars(add)
        min_tokens = -(-chars // max_token_chars)
        if min_tokens >= window:
            raise context_error(add, min_tokens, window, f" ({chars} characters)")
