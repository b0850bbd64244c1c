"""Prompts are tokenized off the engine loop, and come back in arrival order."""

from __future__ import annotations

import threading
import time

import pytest

from protocol.errors import RequestError
from protocol.messages import AddRequest, SamplingParams
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
