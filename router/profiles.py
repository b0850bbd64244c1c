"""Named profiles: `MODEL:PROFILE` names that share MODEL's loaded engine with their own defaults.

A profile (`[profiles."MODEL:PROFILE"]` in the config file, `router.config.Profile`) only
fills in what a request left out, so one copy of the weights can serve e.g. a precise
"coder" and a looser "writer" without a second load. The pool resolves the name; this
module splits it and rewrites the request body before validation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # config imports validation, which imports this module
    from router.config import Profile

# request parameters a profile gives a default for, under the same names as in the request
SAMPLING_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                     "frequency_penalty", "seed")
# a client message in one of these roles is the client's own system prompt, which wins
SYSTEM_ROLES = ("system", "developer")


def split_model_name(name: str) -> tuple[str, str | None]:
    """`"smol:coder"` -> `("smol", "coder")`; a name without a colon has no profile.

    Model names may hold `/` (`mlx-community/...`) but never `:`, so the first colon always
    starts the profile. `"smol:"` gives `("smol", "")`, a profile that cannot exist: the
    client gets a 404 instead of silently getting the bare model.
    """
    model, colon, profile = name.partition(":")
    return (model, profile) if colon else (name, None)


def apply_profile(body: Mapping[str, Any], profile: Profile, kind: Literal["chat", "text"]) -> dict[str, Any]:
    """A new request body in which every parameter the client did not send (absent or null)
    takes the profile's default; the client's own values always win.

    For chat (`kind="chat"`), the profile's system prompt goes first when no message has the
    system (or developer) role. For text completions it is ignored: a raw prompt has no roles
    to put it in, and prepending text would change what the client asked to continue.
    `body` itself is not modified; its values are left for validation to judge.
    """
    merged = dict(body)
    for name in SAMPLING_DEFAULTS:
        value = getattr(profile, name)
        if merged.get(name) is None and value is not None:
            merged[name] = value
    if merged.get("stop") is None and profile.stop is not None:
        merged["stop"] = list(profile.stop)
    sent_max = merged.get("max_tokens") is not None or merged.get("max_completion_tokens") is not None
    if not sent_max and profile.max_tokens is not None:
        merged["max_tokens"] = profile.max_tokens
    messages = merged.get("messages")
    if kind == "chat" and profile.system_prompt is not None and isinstance(messages, list):
        has_system = any(isinstance(m, dict) and m.get("role") in SYSTEM_ROLES for m in messages)
        if not has_system:
            merged["messages"] = [{"role": "system", "content": profile.system_prompt}, *messages]
    return merged
