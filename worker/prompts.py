"""Turn a request's messages or prompt into token ids, the way the model expects.

The chat template is rendered to text and tokenized without adding special tokens
(what HF's `apply_chat_template(tokenize=True)` does): templates carry their own BOS.
Tools and the calls in the history reach the template in the model's tool dialect
(`worker.tool_prompt`), laid out stable first unless told otherwise (`worker.prompt_layout`).
"""

from __future__ import annotations

import logging
from typing import Any

from protocol.errors import RequestError
from protocol.settings import STABLE_FIRST
from protocol.tool_dialects import MLXD
from worker.prompt_layout import PROBE_TOOL, Render, find_tools_block, special_token_texts, tools_first
from worker.tool_prompt import detect_tool_dialect, fallback_messages, template_messages, template_source

logger = logging.getLogger(__name__)


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                continue_final: bool = False, generation_prompt: bool = True,
                layout: str = STABLE_FIRST) -> list[int]:
    """The chat prompt's token ids (`render_chat_text`, tokenized)."""
    return list(tokenizer.encode(render_chat_text(tokenizer, messages, tools, continue_final, generation_prompt,
                                                  layout), add_special_tokens=False))


def render_chat_text(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                     continue_final: bool = False, generation_prompt: bool = True,
                     layout: str = STABLE_FIRST) -> str:
    """The chat prompt's text. A template that renders tools in a dialect we parse gets
    `tools` and the history's calls as it expects them; any other gets them as text in
    mlxd's fallback dialect (the tools in the system prompt). With `continue_final` the last
    (assistant) message is left open, with no generation prompt after it, so the answer
    continues it (HF's `continue_final_message`: the template's end-of-turn is cut off).
    Without `generation_prompt` the text ends with the last message's turn (a conversation's
    start, rendered as the whole renders it: `worker.message_at_token`, and the prefix of a
    cache breakpoint, `worker.cache_breakpoints`; both must pass the request's `layout`).
    `layout` (protocol.settings.PROMPT_LAYOUTS): `stable_first` puts the tools block before
    the system text where the template has both in the system turn (and in the fallback's
    system message), `template` renders exactly as the template does."""
    if not getattr(tokenizer, "chat_template", None):
        raise RequestError(
            "this model has no chat template; use /v1/completions with a prompt",
            param="messages",
        )
    dialect = detect_tool_dialect(template_source(tokenizer))
    if dialect == MLXD:
        messages, tools = fallback_messages(messages, tools, tools_first=layout == STABLE_FIRST), None
    else:
        messages = template_messages(messages, dialect)
    later = _later_system_texts(messages)
    try:
        text = _apply(tokenizer, messages, tools, continue_final, generation_prompt)
    except Exception as exc:  # jinja errors: a template rejecting these messages
        if not later:
            raise RequestError(f"the chat template rejected these messages: {exc}", param="messages") from exc
        text, refusal = "", str(exc)  # rendered again below, hoisted
    else:
        refusal = "it dropped one" if later and not all(t.strip() in text for t in later) else None
    if refusal is not None:
        logger.info("chat template does not take system messages after the first (%s): moving them to the start",
                    refusal)
        messages = hoist_system(messages)
        try:
            text = _apply(tokenizer, messages, tools, continue_final, generation_prompt)
        except Exception as again:
            raise RequestError(f"the chat template rejected these messages: {again}", param="messages") from again
    if layout == STABLE_FIRST and tools:
        text = tools_first(lambda probe, probe_tools: _apply(tokenizer, probe, probe_tools, False),
                           messages, tools, text, special_token_texts(tokenizer))
    return text


def tools_go_first(tokenizer: Any) -> bool:
    """Whether the stable_first layout moves tools before the system text for this model:
    its template writes them after the system text in the system turn, or it speaks mlxd's
    fallback dialect (for the worker's log and status; a request is judged on its own)."""
    if not getattr(tokenizer, "chat_template", None):
        return False
    if detect_tool_dialect(template_source(tokenizer)) == MLXD:
        return True
    render: Render = lambda probe, tools: _apply(tokenizer, probe, tools, False)  # noqa: E731
    return find_tools_block(render, "system", [PROBE_TOOL], special_token_texts(tokenizer)) is not None


def _apply(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
           continue_final: bool, generation_prompt: bool = True) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools or None,
                                         add_generation_prompt=generation_prompt and not continue_final,
                                         continue_final_message=continue_final, tokenize=False)


def _later_system_texts(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages[1:] if m.get("role") == "system" and isinstance(m.get("content"), str)]


def hoist_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """System messages after the first joined into the leading one, in order, for
    templates that take a system message only at the start (they raise or drop later
    ones). Rendering them in place is better where it works: a system note added late in
    a conversation (Claude Code sends them) then leaves the cached prefix before it alone."""
    texts = [m["content"] for m in messages if m.get("role") == "system" and m.get("content")]
    rest = [m for m in messages if m.get("role") != "system"]
    return ([{"role": "system", "content": "\n\n".join(texts)}] if texts else []) + rest


def render_completion(tokenizer: Any, prompt: str | list[int], vocab_size: int) -> list[int]:
    if isinstance(prompt, list):
        bad = [t for t in prompt if not isinstance(t, int) or not 0 <= t < vocab_size]
        if bad:
            raise RequestError(f"prompt token ids must be in [0, {vocab_size}); got {bad[0]!r}", param="prompt")
        return list(prompt)
    return list(tokenizer.encode(prompt))


def longest_token_chars(tokenizer: Any) -> int:
    """Characters of the vocabulary's longest token string: no token covers more text, so
    a text of N characters is at least N / this many tokens (a bound that needs no
    tokenizing; byte-level tokens count bytes, which is never fewer than characters)."""
    return max(1, max((len(token) for token in tokenizer.get_vocab()), default=1))

