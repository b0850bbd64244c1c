"""Which model a requested name means: model ids, their aliases, profiles and the
`model_aliases` patterns, resolved to (model id, profile); the 404 for a name that means
none, and the 400 for a model of the wrong kind. Pure: tables in, answers out, no process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from protocol.errors import RequestError
from router.config import RouterConfig
from router.model_aliases import DEFAULT_TARGET, AliasLog, match_alias
from router.model_registry import ModelEntry
from router.profiles import Profile, split_model_name


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


class ModelNames:
    """The names clients may send, and the model each one means.

    `registry` is the pool's table of discovered models, read here and never written: the
    pool replaces an entry when it converts or fetches a model, under the same id. Names
    are only ever looked up in it, never turned into paths. `pinned` holds names as
    configured or pinned through /admin (a model id or one of its aliases) and changes at
    run time; everything else changes only with the configuration (`apply_config`).
    """

    def __init__(self, registry: Mapping[str, ModelEntry], config: RouterConfig, preload: Sequence[str] = ()) -> None:
        self.registry = registry
        self.config = config
        self.preload = list(preload)  # the command line's models, in its order: loaded first
        self.pinned: set[str] = set(config.pinned)
        self.aliases: dict[str, str] = dict(config.alias_targets)
        self.alias_log = AliasLog()

    @property
    def models(self) -> list[str]:
        return sorted(self.registry)

    @property
    def pinned_ids(self) -> frozenset[str]:
        """The model ids the pins name (a pin may name a model by one of its aliases)."""
        return frozenset(self.aliases.get(name, name) for name in self.pinned)

    @property
    def default_model(self) -> str | None:
        """The model `model_aliases`' DEFAULT_TARGET means: the first command-line model,
        else the first pinned one (None: the service has neither)."""
        if self.preload:
            return self.preload[0]
        pinned = sorted(self.pinned)
        return self.aliases.get(pinned[0], pinned[0]) if pinned else None

    def draft_of(self, model_id: str) -> str | None:
        """The model id of `model_id`'s draft model, if it has one; a 400 when that name
        means no chat model here."""
        name = self.config.settings_for(model_id).draft_model
        if name is None:
            return None
        draft_id = self.aliases.get(name, name)
        entry = self.registry.get(draft_id)
        if entry is None or entry.kind != "chat":
            raise RequestError(f"model '{model_id}' has draft_model '{name}', which is not a chat model here "
                               f"(looked in {self.config.models_dir})", status=400, code="model_not_found")
        return draft_id

    def startup_models(self) -> list[str]:
        """The model ids a start loads, in order: the command line's, then the pinned ones."""
        names = [*self.preload, *sorted(self.pinned - set(self.preload))]
        return list(dict.fromkeys(self.aliases.get(name, name) for name in names))

    def listing(self) -> list[str]:
        """Every name /v1/models lists: chat models first (clients that take the first listed
        model mean one they can chat with), then the other models, then the profiles."""
        models = sorted(self.models, key=lambda m: self.registry[m].kind != "chat")
        return [*models, *(p for p in sorted(self.config.profiles) if p not in self.registry)]

    def resolve(self, name: str) -> tuple[str, Profile | None]:
        """A requested name -> (model id, profile or None): a model, a profile or an alias,
        else the first `model_aliases` pattern it matches. Unknown names are a 404."""
        found = self.resolve_exact(name)
        if found is not None:
            return found
        matched = match_alias(self.config.model_aliases, name)
        if matched is not None:
            pattern, target = matched
            target = self.default_model if target == DEFAULT_TARGET else target
            found = self.resolve_exact(target) if target is not None else None
            if found is not None:
                self.alias_log.note(name, pattern, target)
                return found
        raise self.not_found(name)

    def not_found(self, name: str) -> RequestError:
        """The 404 for a name that means no model, listing those that do."""
        available = ", ".join([*self.models, *sorted(self.config.profiles)]) or "none"
        return RequestError(f"The model '{name}' does not exist. Available models: {available}",
                            status=404, param="model", code="model_not_found")

    def resolve_exact(self, name: str, profiles: Mapping[str, Profile] | None = None,
                      aliases: Mapping[str, str] | None = None) -> tuple[str, Profile | None] | None:
        """`name` as a profile, alias or model id (no pattern), under the running
        configuration or (for `check_config`) the given one; None if it is none of them."""
        profiles = self.config.profiles if profiles is None else profiles
        aliases = self.aliases if aliases is None else aliases
        if name in profiles:
            model_part = split_model_name(name)[0]
            model_id = aliases.get(model_part, model_part)
            if model_id in self.registry:
                return model_id, profiles[name]
        model_id = aliases.get(name, name)
        if model_id in self.registry:
            return model_id, None
        return None

    def check_config(self, config: RouterConfig) -> None:
        """Raise RequestError if `config` pins a model there is none of, or maps a
        `model_aliases` pattern to no model: a typo that would turn every name it catches
        into a 404 stops the start (or a reload) instead."""
        aliases = dict(config.alias_targets)
        unknown = sorted(set(config.pinned) - set(self.registry) - set(aliases))
        if unknown:
            raise RequestError(f"pinned model(s) not found: {', '.join(unknown)} "
                               f"(looked in {config.models_dir})", status=404)
        for pattern, target in config.model_aliases.items():
            if target == DEFAULT_TARGET:
                continue
            if self.resolve_exact(target, config.profiles, aliases) is None:
                raise RequestError(f"model_aliases: {pattern!r} maps to {target!r}, which is no model "
                                   f"(looked in {config.models_dir})", status=404)

    def apply_config(self, config: RouterConfig) -> None:
        """Resolve under `config` from now on (a reload; `check_config` passed). Pins made
        through /admin stay; those the old configuration made go with it."""
        old, self.config = self.config, config
        self.pinned = (self.pinned - set(old.pinned)) | set(config.pinned)
        self.aliases = dict(config.alias_targets)

    def pin(self, name: str) -> str:
        """Pin the model `name` means; returns its id."""
        model_id = self.resolve(name)[0]
        self.pinned.add(model_id)
        return model_id

    def unpin(self, name: str) -> str:
        """Unpin the model `name` means, under any name it was pinned by; returns its id."""
        model_id = self.resolve(name)[0]
        self.pinned -= {pin for pin in self.pinned if self.aliases.get(pin, pin) == model_id}
        return model_id

    def of_kinds(self, kinds: Sequence[str]) -> list[str]:
        return [model_id for model_id in self.models if self.registry[model_id].kind in kinds]

    def check_kind(self, model_id: str, kinds: Sequence[str] = ("chat",), task: str = "completions") -> None:
        """A 400 unless `model_id` can serve `task`: checked before any wait or load."""
        entry = self.registry[model_id]
        if entry.kind not in kinds:
            wanted = " or ".join(kinds)
            raise RequestError(f"model '{model_id}' is {_article(entry.kind)} {entry.kind} model, not {_article(wanted)} {wanted} model; "
                               f"it cannot serve {task} (models that can: {', '.join(self.of_kinds(kinds)) or 'none'})",
                               param="model", code="wrong_model_kind")
