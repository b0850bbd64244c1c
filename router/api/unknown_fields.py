"""Request fields mlxd does not know: ignored, as the real APIs ignore them, and logged
once per field so an operator can tell what a client expected.

Clients add fields every release (Codex's `client_metadata`, Claude Code's
`context_management`, Cursor's `reasoning`): refusing them would break a working agent
on its next update, and logging each request's would drown the log.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import Any

logger = logging.getLogger(__name__)

# what OpenAI's chat and completions APIs define (and mlxd's own extensions); anything in
# here is either read by a parser or accepted without effect on purpose
OPENAI_CHAT_FIELDS = frozenset({
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "stop",
    "seed", "n", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "logprobs",
    "top_logprobs", "stream", "stream_options", "tools", "tool_choice", "parallel_tool_calls", "response_format",
    "user", "cache_salt", "mlxd", "reasoning_effort",
})
OPENAI_COMPLETION_FIELDS = frozenset({
    "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "seed", "n",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "logprobs", "echo", "best_of",
    "stream", "stream_options", "response_format", "user", "cache_salt", "mlxd",
})

_seen: set[tuple[str, str]] = set()


def note_unknown_fields(route: str, body: Mapping[str, Any], known: Collection[str]) -> list[str]:
    """Log the fields of `body` that `route` does not read, each only the first time it is
    seen; returns the unknown ones (for tests)."""
    unknown = sorted(key for key in body if key not in known)
    for key in unknown:
        if (route, key) not in _seen:
            _seen.add((route, key))
            logger.info("%s: ignoring field %r (not an API field mlxd uses; logged once)", route, key)
    return unknown
