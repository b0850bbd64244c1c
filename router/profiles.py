"""Named profiles: `MODEL:PROFILE` names that share MODEL's loaded engine with their own defaults.

A profile (`[profiles."MODEL:PROFILE"]` in the config file) only fills in what a request
left out, so one copy of the weights can serve e.g. a precise "coder" and a looser
"writer" without a second load. Everything about profiles lives here: the settings, their
check (a profile may hold only what a request could), the name rule (the one place a
model name is split), and its application to a parsed request.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from protocol.errors import RequestError
from protocol.settings import PROMPT_LAYOUTS, SPECULATIONS
from router.config_values import ConfigError, normalize_fields, quote_key, setting
from router.validation import parse_sampling

if TYPE_CHECKING:
    from router.validation import ParsedRequest

Parsed = TypeVar("Parsed", bound="ParsedRequest")

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


@dataclass(frozen=True)
class Profile:
    """`[profiles."MODEL:PROFILE"]`: defaults for requests naming `MODEL:PROFILE`.

    A profile shares MODEL's loaded engine, so e.g. a "coder" and a "creative" variant cost
    no extra memory. A field left None lets the request (or the router-wide default)
    decide, and a value the client sends always wins. `system_prompt` applies to chat
    completions only: /v1/completions takes raw text with no roles to put it in, so there it
    is ignored.
    """

    temperature: float | None = setting(None, "sampling temperature for requests that set none")
    top_p: float | None = setting(None, "nucleus sampling cut-off for requests that set none")
    top_k: int | None = setting(None, "top-k cut-off for requests that set none")
    min_p: float | None = setting(None, "min-p cut-off for requests that set none")
    repetition_penalty: float | None = setting(None, "repetition penalty for requests that set none")
    presence_penalty: float | None = setting(None, "presence penalty for requests that set none")
    frequency_penalty: float | None = setting(None, "frequency penalty for requests that set none")
    stop: tuple[str, ...] | None = setting(None, "stop strings for requests that set none")
    seed: int | None = setting(None, "sampling seed for requests that set none (reproducible output)")
    max_tokens: int | None = setting(None, "output cap for requests that set none")
    max_output_tokens: int | None = setting(
        None, "most tokens one request through this profile may generate; a larger max_tokens is clamped to it")
    context_limit: int | None = setting(
        None, "cap on prompt + output tokens, below the model's own, e.g. to keep a cheap profile's requests short"
    )
    system_prompt: str | None = setting(
        None, "system message put first in chat requests that have none (ignored by /v1/completions)"
    )
    prompt_layout: str | None = setting(
        None, "stable_first or template: how this profile's chat prompts with tools are laid out (default: the "
        "service's prompt_layout)")
    tool_text_recovery: bool | None = setting(
        None, "read an answer that is only a call written as text as that call (see the model setting of that name; "
        "default: the model's)")
    tool_call_grammar: bool | None = setting(
        None, "with tool_choice auto, hold a call to the tools once the model opens it (see the model setting of "
        "that name; default: the model's)")
    speculation: str | None = setting(
        None, "off, prompt_lookup or draft_model: this profile's speculative decoding (see the worker setting of "
        "that name; default: the model's, else the service's)")
    reasoning_budget: int | None = setting(
        None, "most tokens a reasoning model may think in requests that set no budget of their own (Anthropic "
        "thinking.budget_tokens, OpenAI reasoning_effort); then the worker closes the span and the model answers")

    def __post_init__(self) -> None:
        normalize_fields(self)


def check_model_name(key: str, name: str) -> None:
    """Model names are what clients put in `model`; a colon there starts a profile name."""
    if not name.strip():
        raise ConfigError(key, "a model name must not be empty")
    if ":" in name:
        model = split_model_name(name)[0]
        raise ConfigError(key, f"{name!r} is not a model name (':' starts a profile name); use {model!r}")


def check_profile(name: str, profile: Profile) -> None:
    """A profile's defaults are request parameters, so the request validator judges them: a
    profile can never hold a value that the same request would be refused for."""
    where = f"profiles.{quote_key(name)}"
    model, label = split_model_name(name)
    if not model or not label or ":" in label:
        raise ConfigError(where, 'must be named "MODEL:PROFILE" (exactly one colon, both parts non-empty)')
    check_model_name(where, model)
    if profile.speculation is not None and profile.speculation not in SPECULATIONS:
        raise ConfigError(f"{where}.speculation", f"must be one of {', '.join(SPECULATIONS)}, "
                          f"got {profile.speculation!r}")
    if profile.prompt_layout is not None and profile.prompt_layout not in PROMPT_LAYOUTS:
        raise ConfigError(f"{where}.prompt_layout", f"must be one of {', '.join(PROMPT_LAYOUTS)}, "
                          f"got {profile.prompt_layout!r}")
    body: dict[str, Any] = {k: v for k, v in dataclasses.asdict(profile).items() if v is not None}
    if profile.stop is not None:
        body["stop"] = list(profile.stop)
    try:
        parse_sampling(body)
    except RequestError as exc:
        raise ConfigError(f"{where}.{exc.param}", exc.message) from None
    if profile.max_output_tokens is not None and profile.max_output_tokens < 1:
        raise ConfigError(f"{where}.max_output_tokens", f"must be >= 1, got {profile.max_output_tokens}")
    if profile.reasoning_budget is not None and profile.reasoning_budget < 0:
        raise ConfigError(f"{where}.reasoning_budget", f"must be >= 0, got {profile.reasoning_budget}")
    if profile.context_limit is not None:
        if profile.context_limit < 2:
            raise ConfigError(f"{where}.context_limit", f"must be >= 2 (a prompt and an answer), got {profile.context_limit}")
        if profile.max_tokens is not None and profile.max_tokens >= profile.context_limit:
            raise ConfigError(f"{where}.max_tokens", f"must be less than context_limit ({profile.context_limit}) "
                              f"to leave room for the prompt, got {profile.max_tokens}")


def sent_parameters(body: Mapping[str, Any], names: Mapping[str, str]) -> frozenset[str]:
    """The parameters a profile defaults that the client set (present and not null), by
    their names in `SamplingParams`; `names` maps the dialect's own field names to those
    (Anthropic's `stop_sequences` -> `stop`, Responses' `max_output_tokens` -> `max_tokens`)."""
    return frozenset(internal for field_name, internal in names.items() if body.get(field_name) is not None)


def with_profile(parsed: Parsed, profile: Profile | None) -> Parsed:
    """The parsed request with the profile's defaults in every parameter the client did not
    send (`parsed.sent`), its context limit and prompt layout; the client's values win.

    Applied once, to the typed request every dialect parses into, so no dialect's body is
    rewritten in another's field names. The profile's system prompt goes first when no
    message has the system (or developer) role; a text completion has no messages, and a
    raw prompt is never prefixed. A breakpoint inside the messages moves with them."""
    if profile is None:
        return parsed
    add = parsed.add
    defaults: dict[str, Any] = {name: getattr(profile, name) for name in SAMPLING_DEFAULTS}
    defaults["stop"] = list(profile.stop) if profile.stop is not None else None
    defaults["max_tokens"] = profile.max_tokens
    changes = {name: value for name, value in defaults.items() if value is not None and name not in parsed.sent}
    messages, breakpoints = add.messages, add.cache_breakpoints
    if (profile.system_prompt is not None and messages is not None
            and not any(m.get("role") in SYSTEM_ROLES for m in messages)):
        messages = [{"role": "system", "content": profile.system_prompt}, *messages]
        breakpoints = [dataclasses.replace(b, message_index=b.message_index + 1) if not b.in_tools else b
                       for b in breakpoints]
    add = dataclasses.replace(add, sampling=dataclasses.replace(add.sampling, **changes), messages=messages,
                              cache_breakpoints=breakpoints, context_limit=profile.context_limit,
                              prompt_layout=profile.prompt_layout,
                              reasoning_budget=(add.reasoning_budget if add.reasoning_budget is not None
                                                else profile.reasoning_budget))
    return dataclasses.replace(parsed, add=add, context_limit=profile.context_limit)
