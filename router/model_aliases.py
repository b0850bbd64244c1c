"""`model_aliases`: glob patterns that map model names no local model has onto one that
exists, for clients that send their vendor's names (Claude Code's `claude-opus-5-5`, its
side calls on `claude-haiku-4-5-20251001`) and cannot easily be told another.

Exact names (models, profiles, `[models."NAME"].aliases`) always win; the patterns are
only tried for a name nothing else matched, first match wins, in the order configured.
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Mapping

logger = logging.getLogger(__name__)

# the target that means "whatever model this service serves by default" (the first
# --model, else the first pinned model), so the default config needs no model name
DEFAULT_TARGET = "<default>"
# Claude Code cannot be told one model name for all its calls (its side calls pick their
# own), so its names reach the default model with no setup; other clients send the name
# their user configured, and an unknown one there is better answered with a 404
DEFAULT_MODEL_ALIASES: Mapping[str, str] = {"claude-*": DEFAULT_TARGET}
_MAX_NAMES_NOTED = 1024  # names logged once each; past this, no more (a client could send endless names)


def match_alias(patterns: Mapping[str, str], name: str) -> tuple[str, str] | None:
    """(pattern, target) of the first pattern in `patterns` that `name` matches, or None.

    Matching is case-sensitive (`fnmatchcase`), so the same name resolves the same way on
    every platform; `*`, `?` and `[...]` are the only special characters."""
    for pattern, target in patterns.items():
        if fnmatch.fnmatchcase(name, pattern):
            return pattern, target
    return None


class AliasLog:
    """Says once per requested name which model serves it, so a user can see in the log
    why `claude-opus-5-5` answers like SmolLM2, without a line per request."""

    def __init__(self) -> None:
        self._noted: set[str] = set()

    def note(self, name: str, pattern: str, model: str) -> None:
        if name in self._noted or len(self._noted) >= _MAX_NAMES_NOTED:
            return
        self._noted.add(name)
        logger.info("model %r is served by %s (model_aliases %r)", name, model, pattern)
