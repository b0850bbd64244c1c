"""The worker loop lets a burst of requests arrive before it starts their prefill.

Clients of one burst reach the worker a few milliseconds apart. Starting the prefill with
the first alone makes every other one wait a whole prefill for its first token; waiting a
short window while nothing runs lets them share one step. Driven with a fake clock, a
scripted channel and a stand-in engine: this is the loop's logic, not the model's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from protocol.child import Lifecycle
from protocol.messages import AbortRequest, AddRequest, Message, SamplingParams
from worker import main
from worker.prompt_preparer import PreparedPrompt, PromptPreparer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@dataclass
class ScriptedChannel:
    """Messages that arrive at given times on the fake clock; receive() advances it."""

    clock: Clock
    arrivals: list[tuple[float, Message]]
    waits_ms: list[int] = field(default_factory=list)

    def receive(self, timeout_ms: int) -> Message | None:
        self.waits_ms.append(timeout_ms)
        if self.arrivals and self.arrivals[0][0] <= self.clock.now + timeout_ms / 1000:
            at, message = self.arrivals.pop(0)
            self.clock.now = max(self.clock.now, at)
            return message
        self.clock.now += timeout_ms / 1000
        return None

    def send(self, message: Message) -> None:
        raise AssertionError(f"nothing should be sent, got {message}")


class StandInEngine:
    """Queues requests; `running` says whether a prefill or decode has begun."""

    def __init__(self, max_num_seqs: int = 8, running: bool = False) -> None:
        self.max_num_seqs = max_num_seqs
        self.running = running
        self.added: list[str] = []

    @property
    def num_active(self) -> int:
        return len(self.added) + int(self.running)

    def has_work(self) -> bool:
        return self.num_active > 0

    def gathering_batch(self) -> bool:
        return not self.running and 0 < self.num_active < self.max_num_seqs

    def add(self, request: AddRequest, prepared: PreparedPrompt | None = None, arrived: float | None = None) -> None:
        self.added.append(request.request_id)

    def check_admissible(self, request_id: str, num_pending: int = 0) -> None:
        pass

    def abort(self, request_id: str) -> None:
        self.added.remove(request_id)


def request(rid: str) -> AddRequest:
    return AddRequest(request_id=rid, prompt="hi", sampling=SamplingParams())


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(main.time, "monotonic", fake.monotonic)
    return fake


def burst(clock: Clock, gaps_ms: list[float]) -> list[tuple[float, Message]]:
    """Requests r0, r1 ... arriving `gaps_ms` apart, the first right away."""
    at, out = clock.now, []
    for i, gap in enumerate([0.0, *gaps_ms]):
        at += gap / 1000
        out.append((at, request(f"r{i}")))
    return out


def test_a_burst_is_gathered_into_one_step(clock: Clock) -> None:
    channel = ScriptedChannel(clock, burst(clock, [3, 4, 9, 2]))
    engine = StandInEngine()
    main._receive_requests(channel, engine, PromptPreparer(lambda r: PreparedPrompt([1]), threaded=False), Lifecycle(), window_ms=10)
    assert engine.added == ["r0", "r1", "r2", "r3", "r4"]
    # it stopped after one window of quiet, not later
    assert clock.now == pytest.approx(1000.0 + 0.018 + 0.010)


def test_a_request_after_a_quiet_window_waits_for_the_next_step(clock: Clock) -> None:
    channel = ScriptedChannel(clock, burst(clock, [5, 25]))
    engine = StandInEngine()
    main._receive_requests(channel, engine, PromptPreparer(lambda r: PreparedPrompt([1]), threaded=False), Lifecycle(), window_ms=10)
    assert engine.added == ["r0", "r1"]
    assert len(channel.arrivals) == 1


def test_gathering_is_capped_at_ten_windows(clock: Clock) -> None:
    channel = ScriptedChannel(clock, burst(clock, [9] * 30))
    engine = StandInEngine(max_num_seqs=100)
    start = clock.now
    main._receive_requests(channel, engine, PromptPreparer(lambda r: PreparedPrompt([1]), threaded=False), Lifecycle(), window_ms=10)
    assert clock.now - start <= 0.100 + 1e-9
    assert 10 <= len(engine.added) <= 12


def test_no_waiting_while_anything_runs(clock: Clock) -> None:
    """A running stream must not stall for a request that has not arrived yet."""
    channel = ScriptedChannel(clock, burst(clock, [1]))
    engine = StandInEngine(running=True)
    main._receive_requests(channel, engine, PromptPreparer(lambda r: PreparedPrompt([1]), threaded=False), Lifecycle(), window_ms=10)
    assert engine.added == ["r0"]
    assert max(channel.waits_ms) == 0


def test_no_waiting_once_the_batch_is_full(clock: Clock) -> None:
    channel = ScriptedChannel(clock, burst(clock, [1, 1, 1]))
    engine = StandInEngine(max_num_seqs=2)
    main._receive_requests(channel, engine, PromptPreparer(lambda r: PreparedPrompt([1]), threaded=False), Lifecycle(), window_ms=10)
    assert engine.added == ["r0", "r1"]


def test_window_zero_never_waits(clock: Clock) -> None:
    channel = ScriptedChannel(clock, burst(clock, [1]))
    engine = StandInEngine()
    main._receive_requests(channel, engine, PromptPreparer(lambda r: PreparedPrompt([1]), threaded=False), Lifecycle(), window_ms=0)
    assert engine.added == ["r0"]


def test_an_abort_during_the_window_is_acted_on(clock: Clock) -> None:
    arrivals = burst(clock, [2])
    arrivals.append((clock.now + 0.004, AbortRequest(request_id="r0")))
    channel = ScriptedChannel(clock, arrivals)
    engine = StandInEngine()
    main._receive_requests(channel, engine, PromptPreparer(lambda r: PreparedPrompt([1]), threaded=False), Lifecycle(), window_ms=10)
    assert engine.added == ["r1"]


def test_a_burst_whose_prompts_take_time_to_tokenize_is_still_gathered(clock: Clock) -> None:
    """Prompts are tokenized on a thread: while nothing runs, the window waits for them
    too, so slow tokenizing does not split the burst over two prefill steps."""
    import time as real_time

    def slow(request: AddRequest) -> PreparedPrompt:
        real_time.sleep(0.02)
        return PreparedPrompt([1])

    channel = ScriptedChannel(clock, burst(clock, [3, 4]))
    engine = StandInEngine()
    preparer = PromptPreparer(slow)
    try:
        main._receive_requests(channel, engine, preparer, Lifecycle(), window_ms=10)
    finally:
        preparer.close()
    assert engine.added == ["r0", "r1", "r2"]
    assert preparer.num_pending == 0
