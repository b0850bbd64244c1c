"""Prompts are tokenized off the engine loop, and come back in arrival order."""

from __future__ import annotations

import threading
import time

import pytest

from protocol.errors import RequestError
from protocol.messages import (
    AddRequest,
    CountTokens,
    ErrorEvent,
    SamplingParams,
    TokenCount,
)
from worker.prompt_preparer import PreparedPrompt, PromptPreparer

pytestmark = pytest.mark.timeout(30)


def request(rid: str, prompt: str = "hi") -> AddRequest:
    return AddRequest(rid, prompt=prompt, sampling=SamplingParams())


def test_results_come_back_in_order_without_blocking_the_caller() -> None:
    release = threading.Event()

    def prepare(r: AddRequest) -> PreparedPrompt:
        if r.request_id == "slow":
            release.wait(5)
        if r.prompt == "bad":
            raise RequestError("prompt is too long", param="prompt")
        return PreparedPrompt([len(r.request_id)])

    preparer = PromptPreparer(prepare)
    try:
        started = time.monotonic()
        for rid, prompt in (("slow", "hi"), ("b", "bad"), ("cc", "hi")):
            preparer.submit(request(rid, prompt))
        assert time.monotonic() - started < 1.0  # submit never waits for the tokenizer
        assert preparer.take_done() == [] and preparer.num_pending == 3
        release.set()
        preparer.wait(5)
        done = preparer.take_done()
        assert [d.request.request_id for d in done] == ["slow", "b", "cc"]
        assert done[0].prompt.prompt_ids == [4] and done[2].prompt.prompt_ids == [2]
        assert isinstance(done[1].error, RequestError) and done[1].prompt is None
        assert preparer.num_pending == 0
    finally:
        preparer.close()


def test_a_cancelled_request_never_comes_out() -> None:
    preparer = PromptPreparer(lambda r: PreparedPrompt([1]), threaded=False)
    preparer.submit(request("a"))
    preparer.submit(request("b"))
    assert preparer.cancel("a") and not preparer.cancel("zzz")
    assert [d.request.request_id for d in preparer.take_done()] == ["b"]


def test_shutdown_takes_everything_pending() -> None:
    release = threading.Event()
    preparer = PromptPreparer(lambda r: PreparedPrompt([int(release.wait(5))]))
    try:
        preparer.submit(request("a"))
        preparer.submit(request("b"))
        assert [r.request_id for r in preparer.take_all()] == ["a", "b"]
        assert preparer.num_pending == 0
    finally:
        release.set()
        preparer.close()


def _count(request: CountTokens) -> int:
    if request.request.prompt == "bad":
        raise RequestError("the chat template rejected these messages", param="messages")
    if request.request.prompt == "bug":
        raise ValueError("a bug")
    return len(request.request.prompt or "")


@pytest.mark.parametrize("threaded", [True, False])
def test_counts_are_answered_apart_from_prompts(threaded: bool) -> None:
    """A count is no request: it takes no slot (`num_pending`), and its answer is a message
    of its own, a TokenCount or an ErrorEvent (a bug in counting is a 500, not a crash)."""
    preparer = PromptPreparer(lambda r: PreparedPrompt([1]), threaded=threaded, count=_count)
    preparer.submit_count(CountTokens(request("c1", "four")))
    preparer.submit_count(CountTokens(request("c2", "bad")))
    preparer.submit_count(CountTokens(request("c3", "bug")))
    assert preparer.num_pending == 0
    answers: list[TokenCount | ErrorEvent] = []
    deadline = time.monotonic() + 5
    while len(answers) < 3 and time.monotonic() < deadline:
        answers += preparer.take_counted()
        time.sleep(0.01)
    by_id = {a.request_id: a for a in answers}
    assert by_id["c1"] == TokenCount("c1", 4)
    assert isinstance(by_id["c2"], ErrorEvent) and by_id["c2"].status == 400
    assert isinstance(by_id["c3"], ErrorEvent) and by_id["c3"].status == 500
    assert preparer.num_counting == 0
    preparer.close()


def test_a_cancelled_count_is_never_answered() -> None:
    preparer = PromptPreparer(lambda r: PreparedPrompt([1]), threaded=False, count=_count)
    preparer.submit_count(CountTokens(request("c1", "four")))
    assert preparer.cancel("c1")
    assert preparer.take_counted() == [] and preparer.num_counting == 0
