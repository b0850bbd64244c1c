"""The bounds one request is held to: its context window, how many tokens it may generate,
and which token ids its logit_bias may name. Pure functions of the request."""

from __future__ import annotations

import logging

from protocol.errors import RequestError
from protocol.messages import AddRequest
from protocol.prompt_bounds import context_error

log = logging.getLogger(__name__)


def context_window(request: AddRequest, context_length: int) -> int:
    """The request's window: the model's, or a profile's own cap, never above the model's."""
    if request.context_limit:
        return min(context_length, request.context_limit)
    return context_length


def check_prompt_cap(request: AddRequest, num_prompt: int, max_prompt_tokens: int) -> None:
    """The server's prompt cap (`max_prompt_tokens`, 0: none), refused like a prompt over the
    context window, so a client that compacts on that error (Claude Code) compacts on this."""
    if 0 < max_prompt_tokens < num_prompt:
        raise RequestError(
            f"prompt is {num_prompt} tokens, more than the {max_prompt_tokens} this server accepts "
            "(max_prompt_tokens); shorten the prompt",
            param="messages" if request.messages is not None else "prompt", code="context_length_exceeded",
            num_prompt_tokens=num_prompt, context_window=max_prompt_tokens)


def max_new_tokens(request: AddRequest, num_prompt: int, window: int, max_output_tokens: int) -> int:
    """How many tokens the request may generate: what it asks for, or else the rest of
    `window` (as OpenAI's API does), never more than the server's cap (the worker's
    `max_output_tokens`, or the model's or profile's tighter one in the request). Asking
    for more is clamped, never refused: agents send limits far beyond a small model's
    window (32000, 128000). Raises the context-length 400 when the prompt leaves no room."""
    room = window - num_prompt
    if room <= 0:
        raise context_error(request, num_prompt, window)
    cap = min(max_output_tokens, request.max_output_tokens or max_output_tokens)
    wanted = request.sampling.max_tokens
    if wanted is not None and wanted > cap:
        log.info("request %s: max_tokens %d clamped to this model's output cap %d (max_output_tokens)",
                 request.request_id, wanted, cap)
    return max(1, min(wanted if wanted is not None else room, cap, room))


def check_logit_bias(request: AddRequest, vocab_size: int) -> None:
    """logit_bias ids index the logits: MLX does no bounds check there (an id past the
    vocabulary writes out of bounds or crashes the process), so it is checked here."""
    for token_id in request.sampling.logit_bias:
        if not 0 <= int(token_id) < vocab_size:
            raise RequestError(f"'logit_bias' token id {token_id} is not in this model's vocabulary "
                               f"[0, {vocab_size})", param="logit_bias")
