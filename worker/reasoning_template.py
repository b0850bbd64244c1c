"""Whether a chat template's model reasons, and how: the markers of its reasoning span and
whether the generation prompt opens the span itself (then the answer starts inside it).

Read from the template at load, like the tool dialect, so the router can split each
answer's reasoning from its text (router/reasoning_split.py) in the worker's own terms.
"""

from __future__ import annotations

import logging
from typing import Any

from worker.tool_prompt import template_source

log = logging.getLogger(__name__)

# (open, close) markers of the reasoning spans templates are known to write
KNOWN_SPANS = (("<think>", "</think>"), ("<|begin_of_thought|>", "<|end_of_thought|>"))


def detect_reasoning(tokenizer: Any) -> tuple[str, str, bool] | None:
    """(open marker, close marker, the generation prompt opens the span) for a template
    that reasons, else None."""
    template = template_source(tokenizer)
    if not template:
        return None
    span = next(((o, c) for o, c in KNOWN_SPANS if o in template and c in template), None)
    if span is None:
        return None
    try:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=False,
                                               add_generation_prompt=True)
    except Exception:  # a template that cannot render a bare question: its span is still its span
        log.warning("the chat template did not render a question; assuming its reasoning span is not open")
        return span[0], span[1], False
    return span[0], span[1], isinstance(prompt, str) and prompt.rstrip().endswith(span[0])


SWITCH = "enable_thinking"  # the template variable Qwen3, GLM-4.5 and SmolLM3 turn reasoning off with


def thinking_switch(tokenizer: Any, budget: int | None) -> dict[str, Any]:
    """The template variables a request's reasoning budget sets: for a template with the
    switch, a budget of 0 renders it off (the model is prompted not to reason, where
    forcing the span shut would still show it an empty one) and any other budget on; no
    budget leaves the template's default. A template without the switch gets nothing."""
    if budget is None or SWITCH not in (template_source(tokenizer) or ""):
        return {}
    return {SWITCH: budget > 0}
