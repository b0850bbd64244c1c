"""Assistant turns rendered back as the tokens the model generated for them.

A chat template renders a tool call from its parsed name and arguments, which need not be
the tokens the model wrote (a bare JSON object or a code block instead of the tags, other
spacing, text before the call on another line): the prefix cache, which keeps the
generated tokens, then misses from that call on. A message the router marked with
`GENERATED_TOKENS` is rendered as a placeholder, and the placeholder's place in the
rendered prompt gets the generated token ids, when it sits right after the template's
generation prompt (where the model started writing); otherwise the prompt is rendered
as the template would, without the marks.
"""

from __future__ import annotations

from typing import Any

from protocol.generated_turns import GENERATED_TOKENS

# private-use code points: no client text holds them, and they survive any template
PLACEHOLDER = "\ue000mlxd-generated-{}\ue001"
REASONED_PLACEHOLDER = "\ue000mlxd-generated-{}-reasoned\ue001"  # the answer of a turn with reasoning
REASONING_PLACEHOLDER = "\ue000mlxd-reasoning-{}\ue001"  # that turn's reasoning, where the template puts it


def has_generated(messages: list[dict[str, Any]]) -> bool:
    return any(GENERATED_TOKENS in message for message in messages)


def without_marks(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as the client sent them (what the template renders by itself)."""
    return [{k: v for k, v in m.items() if k != GENERATED_TOKENS} if GENERATED_TOKENS in m else m for m in messages]


def with_placeholders(messages: list[dict[str, Any]], vocab_size: int) -> tuple[list[dict[str, Any]], list[list[int]]]:
    """Each marked message as a plain assistant message holding a placeholder, and the
    token ids that replace the placeholders, in order. A mark that is not a list of token
    ids of this vocabulary is dropped (the message renders as usual)."""
    out: list[dict[str, Any]] = []
    generated: list[list[int]] = []
    for message in messages:
        ids = message.get(GENERATED_TOKENS)
        if ids is None:
            out.append(message)
            continue
        if (message.get("role") != "assistant" or not isinstance(ids, list) or not ids
                or not all(isinstance(t, int) and 0 <= t < vocab_size for t in ids)):
            out.extend(without_marks([message]))
            continue
        placeholders = {"role": "assistant", "content": PLACEHOLDER.format(len(generated))}
        if message.get("reasoning_content"):
            placeholders = {"role": "assistant", "content": REASONED_PLACEHOLDER.format(len(generated)),
                            "reasoning_content": REASONING_PLACEHOLDER.format(len(generated))}
        out.append(placeholders)
        generated.append(ids)
    return out, generated


_GENERATION_PROMPTS: dict[str, str] = {}  # chat template -> its generation prompt


def generation_prompt(tokenizer: Any) -> str:
    """The text `add_generation_prompt` appends (`<|im_start|>assistant\\n` for ChatML):
    where the model starts writing its answer. "" when the template shows none (or
    cannot render a lone user message): then nothing is spliced."""
    template = tokenizer.chat_template
    key = template if isinstance(template, str) else repr(sorted(template.items()))
    if key not in _GENERATION_PROMPTS:
        probe = [{"role": "user", "content": "\ue000"}]
        try:
            closed = tokenizer.apply_chat_template(probe, add_generation_prompt=False, tokenize=False)
            opened = tokenizer.apply_chat_template(probe, add_generation_prompt=True, tokenize=False)
        except Exception:  # jinja errors of a template that wants more than this
            closed = opened = ""
        _GENERATION_PROMPTS[key] = opened[len(closed):] if opened.startswith(closed) else ""
    return _GENERATION_PROMPTS[key]


def splice(tokenizer: Any, text: str, generated: list[list[int]]) -> list[int] | None:
    """The token ids of `text` with each placeholder replaced by its generated ids; None if
    a placeholder is missing, repeated, or not right after the generation prompt (the
    template changed the turn: its rendering is not what the model continued).

    A turn with reasoning has two placeholders, the reasoning's first: the template may
    write markup before it (Qwen3's `<think>\\n`, which a model that opens its own span
    generated too: the generated text must begin with it) and between the two (the span's
    close, which the generated ids hold); everything from the generation prompt to the
    answer's placeholder is the generated ids. A template that dropped the reasoning of
    that turn shows it without (the generated ids hold it): then nothing is spliced."""
    opening = generation_prompt(tokenizer)
    if not opening:
        return None
    ids: list[int] = []
    rest = text
    for index, tokens in enumerate(generated):
        reasoned = REASONED_PLACEHOLDER.format(index) in rest
        placeholder = (REASONED_PLACEHOLDER if reasoned else PLACEHOLDER).format(index)
        before, found, after = rest.partition(placeholder)
        if not found or placeholder in after:
            return None
        if reasoned:
            before = _before_reasoning(tokenizer, before, REASONING_PLACEHOLDER.format(index), opening, tokens)
            if before is None:
                return None
        elif not before.endswith(opening):
            return None
        ids += tokenizer.encode(before, add_special_tokens=False)
        ids += tokens
        rest = after
    if "\ue000mlxd-" in rest:
        return None
    ids += tokenizer.encode(rest, add_special_tokens=False) if rest else []
    return ids


def _before_reasoning(tokenizer: Any, before: str, thought: str, opening: str, tokens: list[int]) -> str | None:
    """The text before a reasoning turn's generated ids: up to the end of the generation
    prompt that precedes its reasoning placeholder, if the markup between them is what
    the generated text begins with."""
    head, found, between = before.partition(thought)
    at = head.rfind(opening)
    if not found or thought in between or at < 0:
        return None
    cut = at + len(opening)
    markup = head[cut:]
    if markup and not tokenizer.decode(tokens[: len(markup) + 8]).startswith(markup):
        return None
    return head[:cut]
