"""`[models."NAME"]` tables: how the pool treats one model (its own section of the
config file, beside the service-wide settings in `router.config`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from protocol.settings import DRAFT_MODEL
from router.config_values import normalize_fields, setting

if TYPE_CHECKING:
    from router.profiles import Profile


@dataclass(frozen=True)
class ModelSettings:
    """`[models."NAME"]` in the config file: how the pool treats one model."""

    pin: bool = setting(False, "keep this model loaded at all times: never evicted for memory, never unloaded when idle")
    ttl_s: float | None = setting(None, "unload after this many idle seconds, freeing its memory (default: idle_timeout_s)")
    aliases: tuple[str, ...] = setting((), "other names clients may use for this model (e.g. the name another tool expects)")
    max_disk_bytes: int | None = setting(
        None, "this model's cap in the cold tier, so one busy model cannot push out every other's cache (default: none)"
    )
    max_output_tokens: int | None = setting(
        None, "most tokens one request to this model may generate, below the service-wide max_output_tokens")
    tool_text_recovery: bool = setting(
        True, "read an answer that is only a call written as text (a bare or fenced JSON call, or `# Tool` then its "
        "arguments) as that call, when its arguments fit exactly that tool's schema; false: such text stays text")
    tool_call_grammar: bool = setting(
        True, "with tool_choice auto, hold a call to the request's tools from the moment the model opens it (a "
        "known name, arguments valid against its schema, the call closed; free text stays free); false: calls "
        "are free")

    speculation: str | None = setting(
        None, "off, prompt_lookup or draft_model: this model's speculative decoding (see the worker setting of "
        "that name; default: draft_model when draft_model is set, else the service's)")
    draft_model: str | None = setting(
        None, "a model (its id) that drafts tokens for this one under speculation draft_model, loaded in the same "
        "worker: it must share this model's tokenizer (refused at load otherwise); the prefix cache keeps its KV "
        "beside this model's, so a cached prefix never recomputes the draft's")

    def __post_init__(self) -> None:
        normalize_fields(self)


def speculation(settings: ModelSettings, profile: Profile | None) -> str | None:
    """The request's speculation: the profile's when it sets one, else the model's; None
    leaves it to the worker's setting."""
    if profile is not None and profile.speculation is not None:
        return profile.speculation
    if settings.speculation is None and settings.draft_model is not None:
        return DRAFT_MODEL
    return settings.speculation


def tool_text_recovery(settings: ModelSettings, profile: Profile | None) -> bool:
    """Whether a request's calls written as text are read: the profile's switch when it
    sets one, else the model's."""
    if profile is not None and profile.tool_text_recovery is not None:
        return profile.tool_text_recovery
    return settings.tool_text_recovery


def tool_call_grammar(settings: ModelSettings, profile: Profile | None) -> bool:
    """Whether an "auto" request's calls are held by the lazy call grammar: the profile's
    switch when it sets one, else the model's."""
    if profile is not None and profile.tool_call_grammar is not None:
        return profile.tool_call_grammar
    return settings.tool_call_grammar
