"""Which message of a chat prompt renders a given prompt token: a miss that diverged says
where (message index, role, field), so a client's cache-buster can be found.

Runs on the worker's tokenizer thread, and only for a prompt that diverged: a handful of
template renders (a binary search over the conversation's starts, each rendered as the
whole renders it) and at most one tokenization.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from protocol.cache_misses import Divergence
from protocol.messages import AddRequest
from protocol.settings import STABLE_FIRST
from worker.prompts import render_chat_text
from worker.reasoning_template import thinking_switch

log = logging.getLogger(__name__)


def common_prefix_chars(a: str, b: str) -> int:
    """Length of the longest common prefix, by halving (each step one C-level compare)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_suffix_chars(a: str, b: str) -> int:
    return common_prefix_chars(a[::-1], b[::-1])


def char_offset(tokenizer: Any, text: str, prompt_ids: Sequence[int], token: int) -> int:
    """Where prompt token `token` starts in `text`, the text `prompt_ids` tokenize from."""
    before = tokenizer.decode(list(prompt_ids[:token]))
    if text.startswith(before):
        return len(before)
    # a cut inside a character, or a decoder that does not give the text back: offsets
    encoded = tokenizer._tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return int(encoded["offset_mapping"][token][0])


def locate(tokenizer: Any, request: AddRequest, prompt_ids: Sequence[int], token: int,
           layout: str = STABLE_FIRST) -> Divergence:
    """The message (and its field) that renders prompt token `token` of `request`'s chat
    prompt; only the token when the prompt has no messages or the template will not
    render the conversation's starts (then the search cannot run)."""
    if request.messages is None or not 0 <= token < len(prompt_ids):
        return Divergence(token)
    try:
        return _locate(tokenizer, request, prompt_ids, token, layout)
    except Exception as exc:  # a template that rejects a part of a conversation it takes whole
        log.debug("could not tell which message renders token %d: %r", token, exc)
        return Divergence(token)


def _locate(tokenizer: Any, request: AddRequest, prompt_ids: Sequence[int], token: int, layout: str) -> Divergence:
    messages, tools = request.messages or [], request.tools
    switches = thinking_switch(tokenizer, request.reasoning_budget)
    text = render_chat_text(tokenizer, messages, tools, request.continue_final_message, layout=layout,
                            switches=switches)
    at = char_offset(tokenizer, text, prompt_ids, token)

    def reach(start: list[dict[str, Any]], with_tools: bool = True) -> int:
        """How far the rendered start of the conversation agrees with the whole text."""
        return common_prefix_chars(render_chat_text(tokenizer, start, tools if with_tools else None,
                                                    generation_prompt=False, layout=layout, switches=switches), text)

    index = _first(len(messages), lambda k: reach(messages[: k + 1]) > at)
    if index is None:
        return Divergence(token, None, None, "generation_prompt")
    message = messages[index]
    if tools:
        without = render_chat_text(tokenizer, messages, None, request.continue_final_message, layout=layout,
                                   switches=switches)
        start = common_prefix_chars(text, without)
        end = len(text) - min(_common_suffix_chars(text, without), len(text) - start)
        if start <= at < end:
            return Divergence(token, index, message.get("role"), "tools")
    field = "content"
    if message.get("tool_calls"):
        bare = {k: v for k, v in message.items() if k != "tool_calls"}
        bare["content"] = bare.get("content") or ""
        if reach([*messages[:index], bare]) <= at:
            field = "tool_calls"
    return Divergence(token, index, message.get("role"), field)


def _first(n: int, holds: Callable[[int], bool]) -> int | None:
    """The smallest k in [0, n) for which `holds(k)` (true from some k on), or None."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo if lo < n else None
