"""Stable before volatile: a chat prompt laid out so that what every session shares comes
first. Templates in the Qwen2.5 / Hermes style write the system turn as the system text,
then the tool definitions; the system text names the project (Claude Code's names its
directory), so a session in another project diverges there and recomputes the ~8K tokens
of identical tools after it. With the tools block moved before the system text, inside the
same system turn, those tools are a prefix every session shares (Anthropic's own cache
order: tools, system, messages).

The move is found, not assumed: the template is rendered with marker texts, the tools
block is what adding `tools` inserts right after the system text, and a layout that is not
exactly that (Llama 3.x puts tools in the first user turn, Mistral before the last user
turn) is rendered as the template does. Everything here is a pure function of its input:
the prefix cache needs the same request to give the same tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

# messages, tools -> the template's text for them, generation prompt included
Render = Callable[[list[dict[str, Any]], "list[dict[str, Any]] | None"], str]

SYSTEM_ROLES = ("system", "developer")
# marker texts rendered in place of the system text and a user turn, to find the tools
# block (only probes hold them: a request's own texts are never searched)
SYSTEM_MARKER = "mlxd-layout-system-text-7f3a"
USER_MARKER = "mlxd-layout-user-text-7f3a"
# the tool probed at load time, to tell which layout a template allows
PROBE_TOOL = {"type": "function", "function": {
    "name": "probe", "description": "A probe.",
    "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}}}


@dataclass(frozen=True)
class ToolsBlock:
    """How a template writes a system turn with tools: `head` (the turn's opening, before the
    system text), then the system text, `separator`, and `block` (the tool instructions and
    definitions, up to the end of the turn). The block holds no special token, so it ends
    no turn: moving it moves text within one turn."""

    head: str
    separator: str
    block: str


def find_tools_block(render: Render, role: str, tools: list[dict[str, Any]],
                     special_tokens: Collection[str]) -> ToolsBlock | None:
    """The template's tools block for `tools` after a `role` message, or None when adding
    tools does anything else than insert whitespace and one block of plain text right
    after the system text (or the template fails on the probe)."""
    probe = [{"role": role, "content": SYSTEM_MARKER}, {"role": "user", "content": USER_MARKER}]
    try:
        with_tools, without = render(probe, tools), render(probe, None)
    except Exception:  # noqa: BLE001  (a template that refuses the probe: render as it does)
        return None
    if with_tools.count(SYSTEM_MARKER) != 1 or without.count(SYSTEM_MARKER) != 1:
        return None
    head, _, after = with_tools.partition(SYSTEM_MARKER)
    head_without, _, rest = without.partition(SYSTEM_MARKER)
    if head != head_without or not rest or not after.endswith(rest) or len(after) == len(rest):
        return None
    inserted = after[: len(after) - len(rest)]
    block = inserted.lstrip()
    separator = inserted[: len(inserted) - len(block)]
    if not separator or not block.strip() or any(token in inserted for token in special_tokens):
        return None
    return ToolsBlock(head, separator, block)


def tools_first(render: Render, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, text: str,
                special_tokens: Collection[str]) -> str:
    """`text`, the template's rendering of `messages` with `tools`, with the tools block
    moved before the leading system text, the template's separator between them:
    `head + block + separator + system + rest` for the template's
    `head + system + separator + block + rest`. `text` itself when there are no tools, no
    leading system text (the template's default system text is as stable as the tools),
    or the layout is not recognised."""
    if not tools or not messages:
        return text
    role, system = messages[0].get("role"), messages[0].get("content")
    if role not in SYSTEM_ROLES or not isinstance(system, str) or not system.strip():
        return text
    found = find_tools_block(render, role, tools, special_tokens)
    if found is None:
        return text
    as_template = found.head + system + found.separator + found.block
    if not text.startswith(as_template):
        return text
    return found.head + found.block + found.separator + system + text[len(as_template):]


def special_token_texts(tokenizer: Any) -> list[str]:
    """The texts of the tokenizer's special tokens (turn markers such as `<|im_end|>`):
    a tools block holding one would end the turn it is moved out of."""
    texts = set(getattr(tokenizer, "all_special_tokens", None) or ())
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    texts.update(token.content for token in decoder.values() if getattr(token, "special", False))
    return sorted(text for text in texts if text)
