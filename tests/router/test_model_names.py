"""router.children.model_names: what a requested name means, tested on tables alone (no process,
no model directory): models, aliases, profiles, patterns, the 404 and the 400's text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from protocol.errors import RequestError
from router.config import make_config
from router.children.model_names import ModelNames
from router.model_registry import ModelEntry

MB = 1 << 20


def entry(model_id: str, kind: str = "chat") -> ModelEntry:
    return ModelEntry(model_id, Path("/nowhere") / model_id, kind, 100 * MB)


REGISTRY = {m.id: m for m in (entry("smol"), entry("qwen"), entry("minilm", "embedding"), entry("bge", "reranker"))}
CONFIG: dict[str, Any] = {
    "models": {"smol": {"aliases": ["mini"]}, "qwen": {"aliases": ["coder"]}},
    "profiles": {"smol:brief": {"max_tokens": 3}, "mini:loose": {"temperature": 1.0}, "qwen:exact": {"seed": 1}},
    "model_aliases": {"claude-*-haiku-*": "qwen:exact", "claude-*": "<default>", "gpt-*": "coder"},
}


def names(preload: tuple[str, ...] = ("smol",), **overrides: Any) -> ModelNames:
    return ModelNames(REGISTRY, make_config({**CONFIG, **overrides}), preload=preload)


@pytest.mark.parametrize(("name", "model_id", "profile"), [
    ("smol", "smol", None),
    ("mini", "smol", None),  # a [models."smol"] alias
    ("smol:brief", "smol", "smol:brief"),
    ("mini:loose", "smol", "mini:loose"),  # a profile named after an alias serves the aliased model
    ("claude-3-5-haiku-latest", "qwen", "qwen:exact"),  # the first matching pattern wins, a profile target
    ("claude-opus-5-5", "smol", None),  # <default>: the first command-line model
    ("gpt-4o", "qwen", None),  # a pattern's target may be an alias
    ("minilm", "minilm", None),
])
def test_resolve(name: str, model_id: str, profile: str | None) -> None:
    table = names()
    assert table.resolve(name) == (model_id, table.config.profiles[profile] if profile else None)


@pytest.mark.parametrize("name", ["nope", "smol:", "smol:nope", "../smol", "/etc/passwd", "Smol"])
def test_unknown_names_are_a_404_listing_every_model_and_profile(name: str) -> None:
    with pytest.raises(RequestError) as caught:
        names().resolve(name)
    error = caught.value
    assert (error.status, error.code, error.param) == (404, "model_not_found", "model")
    assert error.message == (f"The model '{name}' does not exist. Available models: "
                             "bge, minilm, qwen, smol, mini:loose, qwen:exact, smol:brief")


def test_exact_names_win_over_patterns() -> None:
    table = names(model_aliases={"*": "qwen"})
    assert table.resolve("smol") == ("smol", None) and table.resolve("mini") == ("smol", None)
    assert table.resolve("anything") == ("qwen", None)


@pytest.mark.parametrize(("preload", "pin", "default"), [
    (("qwen", "smol"), (), "qwen"),  # the first command-line model
    ((), ("mini", "qwen"), "smol"),  # else the first pin (sorted), through its alias
    ((), (), None),
])
def test_the_default_model(preload: tuple[str, ...], pin: tuple[str, ...], default: str | None) -> None:
    table = names(preload, pin=pin)
    assert table.default_model == default
    if default is None:  # <default> then means nothing: claude-* names are a 404
        with pytest.raises(RequestError):
            table.resolve("claude-opus-5-5")
    else:
        assert table.resolve("claude-opus-5-5") == (default, None)


def test_startup_models_are_the_command_lines_then_the_pinned_once_each() -> None:
    assert names(("qwen",), pin=("mini", "smol", "coder")).startup_models() == ["qwen", "smol"]


def test_listing_puts_chat_models_first_then_the_profiles() -> None:
    assert names().listing() == ["qwen", "smol", "bge", "minilm", "mini:loose", "qwen:exact", "smol:brief"]


def test_pins_name_models_by_id_or_alias() -> None:
    table = names(pin=("mini",))
    assert table.pinned_ids == {"smol"}
    assert table.pin("coder") == "qwen" and table.pinned_ids == {"smol", "qwen"}
    table.unpin("smol")  # by its id, though it was pinned by its alias
    assert table.pinned_ids == {"qwen"}
    with pytest.raises(RequestError):
        table.pin("nope")


def test_a_reload_keeps_admin_pins_and_drops_the_old_configurations() -> None:
    table = names(pin=("smol",))
    table.pin("qwen")
    table.apply_config(make_config({**CONFIG, "pin": ["minilm"], "models": {}}))
    assert table.pinned_ids == {"qwen", "minilm"}
    with pytest.raises(RequestError):
        table.resolve("mini")  # its alias went with the old [models."smol"] table


@pytest.mark.parametrize(("overrides", "words"), [
    ({"pin": ["nope"]}, "pinned model(s) not found: nope"),
    ({"model_aliases": {"claude-*": "nope"}}, "'claude-*' maps to 'nope', which is no model"),
])
def test_check_config_refuses_what_would_name_no_model(overrides: dict[str, Any], words: str) -> None:
    table = names()
    with pytest.raises(RequestError) as caught:
        table.check_config(make_config({**CONFIG, **overrides}))
    assert words in caught.value.message and caught.value.status == 404
    table.check_config(make_config({**CONFIG, "pin": ["mini"]}))  # an alias is a model's name too


@pytest.mark.parametrize(("model_id", "kinds", "message"), [
    ("minilm", ("chat",), "model 'minilm' is an embedding model, not a chat model; it cannot serve completions "
                          "(models that can: qwen, smol)"),
    ("smol", ("embedding",), "model 'smol' is a chat model, not an embedding model; it cannot serve completions "
                             "(models that can: minilm)"),
    ("smol", ("embedding", "reranker"), "model 'smol' is a chat model, not an embedding or reranker model; it "
                                        "cannot serve completions (models that can: bge, minilm)"),
])
def test_a_model_of_the_wrong_kind_is_a_400_naming_those_that_can(model_id: str, kinds: tuple[str, ...],
                                                                   message: str) -> None:
    with pytest.raises(RequestError) as caught:
        names().check_kind(model_id, kinds)
    assert (caught.value.status, caught.value.code, caught.value.message) == (400, "wrong_model_kind", message)
    names().check_kind(model_id, ("chat", "embedding", "reranker"))


def test_a_draft_model_is_named_by_id_or_alias_and_must_be_a_chat_model_here() -> None:
    models = {"qwen": {"draft_model": "mini"}, "smol": {"aliases": ["mini"], "draft_model": "minilm"},
              "bge": {"draft_model": "gone"}}
    table = names(models=models)
    assert table.draft_of("qwen") == "smol"  # "mini" is smol's alias
    assert table.draft_of("minilm") is None
    for model_id in ("smol", "bge"):  # an embedding model; a name no model has
        with pytest.raises(RequestError) as err:
            table.draft_of(model_id)
        assert err.value.status == 400 and "not a chat model here" in err.value.message
