"""The one table of dialects. The app mounts their routes from it, the cache probe finds
a body's dialect and prompt in it, /openapi.json describes it, and the middlewares answer
in each dialect's error shape through it. A new dialect is a module in `router/api/` with
an `ENTRY`, and one line here.

The order is the order a probe body that does not name its `api` is tried in: the most
specific claim first, OpenAI chat (any body with `messages`) last of those that claim."""

from __future__ import annotations

from router.api import (
    anthropic_dialect,
    openai_chat,
    openai_completions,
    openai_embeddings,
    openai_responses,
    rerank,
)
from router.api.dialect_entry import DialectEntry
from router.http_errors import register_error_shape

DIALECTS: tuple[DialectEntry, ...] = (
    openai_completions.ENTRY,
    openai_responses.ENTRY,
    anthropic_dialect.ENTRY,
    openai_chat.ENTRY,
    openai_embeddings.ENTRY,
    rerank.ENTRY,
)

for _entry in DIALECTS:
    if _entry.error_shape is not None:
        register_error_shape(_entry.error_shape)


def prompt_dialects() -> tuple[DialectEntry, ...]:
    """The dialects whose bodies hold a prompt (the cache probe's `api` values)."""
    return tuple(d for d in DIALECTS if d.prompt is not None)


def dialect_named(name: str) -> DialectEntry | None:
    return next((d for d in DIALECTS if d.name == name), None)
