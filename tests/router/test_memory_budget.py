"""router.children.memory_budget: what a model needs, what the loaded ones are charged, and which
one makes room, on plain records (no process): the least recently used idle unpinned model."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.errors import RequestError
from router.config import make_config
from router.children.memory_budget import AllBusy, LoadedModel, MemoryBudget
from router.model_registry import RUNTIME_OVERHEAD_BYTES, ModelEntry

MB = 1 << 20
NEED = 100 * MB
TWO_SLOTS = MemoryBudget(2 * NEED + NEED // 2)  # two models fit, a third does not


def model(model_id: str, last_used: float, *, in_flight: int = 0, pinned: bool = False, rss: int = 0) -> LoadedModel:
    return LoadedModel(model_id, NEED, rss_bytes=rss, last_used=last_used, in_flight=in_flight, pinned=pinned)


@pytest.mark.parametrize(("loaded", "victim"), [
    # three models, two slots: the least recently used goes, whatever order they were listed in
    ([model("a", 1.0), model("b", 2.0)], "a"),
    ([model("a", 2.0), model("b", 1.0)], "b"),
    ([model("b", 3.0), model("a", 1.0), model("c", 2.0)], "a"),
    # a pinned model or one with requests in flight is passed over, however old
    ([model("a", 1.0, pinned=True), model("b", 2.0)], "b"),
    ([model("a", 1.0, in_flight=1), model("b", 2.0)], "b"),
    # never used: the oldest of all
    ([model("a", 5.0), LoadedModel("b", NEED)], "b"),
    # room is there already
    ([model("a", 1.0)], None),
    ([], None),
    # the model making room is not its own victim, nor charged
    ([model("x", 0.0), model("a", 1.0)], None),
])
def test_the_victim_is_the_least_recently_used_idle_unpinned_model(loaded: list[LoadedModel],
                                                                    victim: str | None) -> None:
    assert TWO_SLOTS.victim(loaded, "x", NEED) == victim


def test_evicting_the_victims_in_turn_goes_from_the_least_recently_used_up() -> None:
    budget = MemoryBudget(3 * NEED)
    loaded = [model("c", 3.0), model("a", 1.0), model("d", 4.0), model("b", 2.0)]
    evicted = []
    while (victim := budget.victim(loaded, "x", 2 * NEED)) is not None:
        evicted.append(victim)
        loaded = [m for m in loaded if m.model_id != victim]
    assert evicted == ["a", "b", "c"]


def test_a_model_is_charged_its_rss_when_it_grew_past_its_estimate() -> None:
    grown = model("a", 1.0, rss=2 * NEED)
    assert grown.charged_bytes == 2 * NEED and model("a", 1.0, rss=NEED // 2).charged_bytes == NEED
    assert TWO_SLOTS.used_bytes([grown, model("b", 2.0)]) == 3 * NEED
    assert TWO_SLOTS.victim([grown], "x", NEED) == "a"  # its estimate alone would fit beside x


def test_only_pinned_models_in_the_way_is_a_503() -> None:
    with pytest.raises(RequestError) as caught:
        TWO_SLOTS.victim([model("a", 1.0, pinned=True), model("b", 2.0, pinned=True)], "x", NEED)
    assert (caught.value.status, caught.value.code) == (503, "insufficient_memory")
    assert "held by pinned models" in caught.value.message


def test_every_evictable_model_busy_means_wait() -> None:
    with pytest.raises(AllBusy):
        TWO_SLOTS.victim([model("a", 1.0, in_flight=2), model("b", 2.0, pinned=True)], "x", NEED)


def test_a_model_bigger_than_the_whole_budget_is_a_503_naming_the_settings() -> None:
    TWO_SLOTS.check_fits_alone("x", TWO_SLOTS.budget_bytes)
    with pytest.raises(RequestError) as caught:
        TWO_SLOTS.check_fits_alone("x", TWO_SLOTS.budget_bytes + 1)
    assert caught.value.status == 503 and "memory_budget_bytes" in caught.value.message


@pytest.mark.parametrize(("budget", "configured", "hot_tier"), [
    (16 << 30, 0, 2 << 30),  # an eighth of the budget
    (1 << 30, 0, 256 * MB),  # but at least 256 MB
    (16 << 30, 64 * MB, 64 * MB),  # as configured
])
def test_the_hot_tier_budget(budget: int, configured: int, hot_tier: int) -> None:
    assert MemoryBudget(budget, configured).hot_tier_bytes == hot_tier


@pytest.mark.parametrize(("kind", "hot_tier"), [("chat", 64 * MB), ("embedding", 0), ("reranker", 0)])
def test_a_chat_model_needs_a_hot_tier_and_an_encoder_none(kind: str, hot_tier: int) -> None:
    entry = ModelEntry("m", Path("/nowhere"), kind, 500 * MB)
    assert MemoryBudget(4 << 30, 64 * MB).need_bytes(entry) == 500 * MB + hot_tier + RUNTIME_OVERHEAD_BYTES


def test_from_config_reads_the_budget_and_the_hot_tier() -> None:
    budget = MemoryBudget.from_config(make_config({"memory_budget_bytes": 3 << 30, "hot_tier_bytes": 32 * MB}))
    assert (budget.budget_bytes, budget.hot_tier_bytes) == (3 << 30, 32 * MB)
