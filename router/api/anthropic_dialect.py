"""The Anthropic Messages dialect's entry in the registry: `/v1/messages` and its
`count_tokens`, Anthropic's error shape for every request its clients send (on its routes,
or anywhere with the `anthropic-version` header its SDKs always send), and the prompt a
Messages body renders to, for the cache probe and snapshots."""

from __future__ import annotations

from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request

from protocol.messages import AddRequest
from router.api import anthropic_count_tokens, anthropic_errors, anthropic_messages, schemas
from router.api.dialect_entry import DialectEntry, Endpoint
from router.http_errors import ErrorShape
from router.profiles import Profile

PATH = "/v1/messages"  # and everything under it: count_tokens
VERSION_HEADER = "anthropic-version"
# content blocks only Anthropic's Messages API has
_ANTHROPIC_BLOCKS = frozenset({"tool_use", "tool_result", "thinking", "redacted_thinking", "image", "document"})


def _prompt(request: Request, body: dict[str, Any], profile: Profile | None) -> AddRequest:
    """As /v1/messages/count_tokens renders it (no max_tokens needed: nothing is generated)."""
    return anthropic_count_tokens.count_request(body, profile, request.app.state.config.normalize_billing_header)


def _claims(body: dict[str, Any], headers: Headers) -> bool:
    """A body with `messages` is Anthropic's when it has a top-level `system`, tools with an
    `input_schema`, or Anthropic-only content blocks, or the request carries the
    `anthropic-version` header."""
    if "messages" not in body:
        return False
    if "system" in body or headers.get(VERSION_HEADER) is not None:
        return True
    tools = body.get("tools")
    if isinstance(tools, list) and any(isinstance(t, dict) and "input_schema" in t for t in tools):
        return True
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(isinstance(b, dict) and b.get("type") in _ANTHROPIC_BLOCKS
                                             for b in content):
            return True
    return False


ENTRY = DialectEntry(
    "messages",
    (Endpoint(PATH, "POST", anthropic_messages.messages, "Anthropic Messages", schemas.MESSAGES),
     Endpoint(PATH + "/count_tokens", "POST", anthropic_count_tokens.count_tokens,
              "exact prompt tokens of a Messages body", schemas.COUNT_TOKENS)),
    prompt=_prompt, claims=_claims,
    error_shape=ErrorShape(PATH, VERSION_HEADER, anthropic_errors.refusal),
)
