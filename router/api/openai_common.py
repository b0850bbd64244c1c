"""Fields both OpenAI dialects (chat and text completions) share, beyond sampling."""

from __future__ import annotations

from typing import Any

from router.profiles import SAMPLING_DEFAULTS
from router.validation import bad, flag, is_int, optional_str, short

# the chat and completions fields a profile may default -> their SamplingParams names
OPENAI_SAMPLING_NAMES = {**{name: name for name in SAMPLING_DEFAULTS}, "stop": "stop", "max_tokens": "max_tokens",
                         "max_completion_tokens": "max_tokens"}


def stream_flags(body: dict[str, Any]) -> tuple[bool, bool]:
    """stream, include_usage; and the parameters we accept but cannot honour (logprobs
    are the dialects' own: `router.api.logprobs`)."""

    n = body.get("n")
    if n is not None and (not is_int(n) or n != 1):
        raise bad("n", f"'n' must be 1 (one choice per request is supported), got {short(n)}")
    optional_str(body, "user")
    stream = flag(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad("stream_options", "'stream_options' must be an object")
    include_usage = (options or {}).get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise bad("stream_options", "'stream_options.include_usage' must be true or false")
    return stream, bool(include_usage)


def cache_salt(body: dict[str, Any]) -> str | None:
    """mlxd's extension: requests with different salts never share cached blocks."""
    return optional_str(body, "cache_salt")


def wants_progress(body: dict[str, Any]) -> bool:
    """mlxd's extension: `"mlxd": {"progress": true}` streams prefill progress chunks."""
    extension = body.get("mlxd")
    if extension is None:
        return False
    if not isinstance(extension, dict):
        raise bad("mlxd", "'mlxd' must be an object, e.g. {\"progress\": true}")
    return flag(extension, "progress")
