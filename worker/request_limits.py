"""The bounds one request is held to: its context window, how many tokens it may generate,
and which token ids its logit_bias may name. Pure functions of the request."""

from __future__ import annotations

from protocol.errors import RequestError
from protocol.messages import AddRequest
from protocol.prompt_bounds import context_error


def context_window(request: AddRequest, context_length: int) -> int:
    """The request's window: the model's, or a profile's own cap, never above the model's."""
    if request.context_limit:
        return min(context_length, request.context_limit)
    return context_length


def max_new_tokens(request: AddRequest, num_prompt: int, window: int, default_max_tokens: int) -> int:
    """How many tokens the request may generate: what it asks for (or the default), cut
    to the room its prompt leaves in `window`; raises the context-length 400 if none."""
    room = window - num_prompt
    if room <= 0:
        raise context_error(request, num_prompt, window)
    wanted = request.sampling.max_tokens
    if wanted is None:
        wanted = default_max_tokens
    return max(1, min(wanted, room))


def check_logit_bias(request: AddRequest, vocab_size: int) -> None:
    """logit_bias ids index the logits: MLX does no bounds check there (an id past the
    vocabulary writes out of bounds or crashes the process), so it is checked here."""
    for token_id in request.sampling.logit_bias:
        if not 0 <= int(token_id) < vocab_size:
            raise RequestError(f"'logit_bias' token id {token_id} is not in this model's vocabulary "
                               f"[0, {vocab_size})", param="logit_bias")
