"""The memory all loaded models share: what one model needs, what the loaded ones are
charged, and which model to unload so another fits. Pure: the pool measures, this decides.

A loaded model is charged the larger of its estimate (weights served + hot-tier budget +
runtime overhead) and its worker's measured RSS, so a model that grew past its estimate is
charged what it really uses.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from protocol.errors import RequestError
from router.config import RouterConfig
from router.model_registry import RUNTIME_OVERHEAD_BYTES, ModelEntry

MIN_HOT_TIER_BYTES = 256 << 20  # the automatic hot tier never goes below this
HOT_TIER_SHARE = 8  # the automatic hot tier is this fraction (1/8) of the memory budget


@dataclass(frozen=True)
class LoadedModel:
    """What the budget knows of one running worker."""

    model_id: str
    need_bytes: int  # the estimate (`MemoryBudget.need_bytes`)
    rss_bytes: int = 0  # measured; 0 when unknown
    last_used: float = 0.0  # when a request last used it (any clock, the same for all)
    in_flight: int = 0  # requests it is serving now: it cannot be unloaded
    pinned: bool = False  # never unloaded to make room

    @property
    def charged_bytes(self) -> int:
        return max(self.need_bytes, self.rss_bytes)


class AllBusy(Exception):
    """Room is needed, and every model that could give it has requests in flight: the
    caller waits for one to finish and asks again."""


def insufficient_memory(message: str) -> RequestError:
    return RequestError(message, status=503, error_type="server_error", code="insufficient_memory")


class MemoryBudget:
    """`budget_bytes` shared by the loaded models.

    Invariants of `victim`: a pinned model is never chosen, nor one with requests in
    flight; among the rest the least recently used goes first.
    """

    def __init__(self, budget_bytes: int, hot_tier_bytes: int = 0) -> None:
        self.budget_bytes = budget_bytes
        self.configured_hot_tier_bytes = hot_tier_bytes  # 0: derived from the budget

    @classmethod
    def from_config(cls, config: RouterConfig) -> MemoryBudget:
        return cls(config.effective_memory_budget_bytes, config.hot_tier_bytes)

    @property
    def hot_tier_bytes(self) -> int:
        """Each chat worker's hot-tier budget: as configured, or an eighth of the budget."""
        return self.configured_hot_tier_bytes or max(MIN_HOT_TIER_BYTES, self.budget_bytes // HOT_TIER_SHARE)

    def need_bytes(self, entry: ModelEntry) -> int:
        """Weights + runtime, and a hot tier for a chat model (encoders keep no KV cache)."""
        hot_tier = self.hot_tier_bytes if entry.kind == "chat" else 0
        return entry.weights_bytes + hot_tier + RUNTIME_OVERHEAD_BYTES

    @staticmethod
    def used_bytes(loaded: Iterable[LoadedModel]) -> int:
        return sum(model.charged_bytes for model in loaded)

    def check_fits_alone(self, model_id: str, need: int) -> None:
        """A 503 if `model_id` would not fit even with nothing else loaded."""
        if need > self.budget_bytes:
            raise insufficient_memory(
                f"model '{model_id}' needs about {need / 1e9:.2f} GB but the memory budget is "
                f"{self.budget_bytes / 1e9:.2f} GB; raise memory_budget_bytes or lower hot_tier_bytes")

    def victim(self, loaded: Iterable[LoadedModel], model_id: str, need: int) -> str | None:
        """The model to unload so `need` more bytes fit beside `loaded` (which `model_id`,
        the model making room, is not part of): None once they fit, else the least recently
        used idle unpinned model. Raises a 503 RequestError if only pinned models hold the
        memory, and AllBusy if every unpinned one has requests in flight."""
        loaded = [model for model in loaded if model.model_id != model_id]
        used = self.used_bytes(loaded)
        if used + need <= self.budget_bytes:
            return None
        candidates = [model for model in loaded if not model.pinned]
        if not candidates:
            raise insufficient_memory(
                f"model '{model_id}' needs about {need / 1e9:.2f} GB; {used / 1e9:.2f} GB of the "
                f"{self.budget_bytes / 1e9:.2f} GB budget is held by pinned models")
        idle = [model for model in candidates if model.in_flight == 0]
        if not idle:
            raise AllBusy(model_id)
        return min(idle, key=lambda model: model.last_used).model_id
