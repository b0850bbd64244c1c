"""Claude Code's billing line, removed from the system prompt before it is rendered.

Claude Code sends `x-anthropic-billing-header: cc_version=...; cc_entrypoint=...; cch=...;`
as the first system text block. Part of it changes on every request (`cch` is a nonce), and
at token ~40 of the prompt a changed token makes every later block of the prefix cache miss:
each turn would recompute the whole system prompt and history. Anthropic's own API drops
it the same way; `normalize_billing_header = false` keeps it.
"""

from __future__ import annotations

BILLING_PREFIX = "x-anthropic-billing-header:"


def is_billing_line(text: str) -> bool:
    """A text that is Claude Code's billing line (leading whitespace allowed)."""
    return text.lstrip().lower().startswith(BILLING_PREFIX)


def without_billing_lines(texts: list[str]) -> list[str]:
    """The system texts without the billing line: a block that is the line is dropped,
    and so is a first line that is one (a client that sends the system prompt as one
    string with the line on top)."""
    out = []
    for text in texts:
        if is_billing_line(text):
            _, newline, rest = text.lstrip().partition("\n")
            if not newline or not rest.strip():
                continue
            text = rest
        out.append(text)
    return out
