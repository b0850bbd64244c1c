"""What every robustness test checks after its bad input: a stream running alongside was
not cut, and a fixed greedy prompt still gets the answer it got before."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import openai

PROBE = [{"role": "user", "content": "What is the capital of France?"}]
STORY = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


def probe(client: openai.OpenAI, model: str) -> str:
    """The fixed greedy prompt's answer."""
    reply = client.chat.completions.create(model=model, messages=PROBE, temperature=0, max_tokens=12)
    return reply.choices[0].message.content or ""


class Bystander:
    """A greedy stream running alongside the bad requests; records when each token came."""

    def __init__(self, client: openai.OpenAI, model: str, max_tokens: int) -> None:
        self.times: list[float] = []
        self.finish_reason: str | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(client, model, max_tokens), daemon=True)
        self._thread.start()

    def _run(self, client: openai.OpenAI, model: str, max_tokens: int) -> None:
        try:
            stream = client.chat.completions.create(model=model, messages=STORY, temperature=0,
                                                    max_tokens=max_tokens, stream=True)
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    self.times.append(time.monotonic())
                if chunk.choices and chunk.choices[0].finish_reason:
                    self.finish_reason = chunk.choices[0].finish_reason
        except BaseException as exc:  # noqa: BLE001 - reported by join()
            self.error = exc

    def wait_started(self) -> None:
        deadline = time.monotonic() + 60
        while not self.times and self.error is None and time.monotonic() < deadline:
            time.sleep(0.02)

    def join(self) -> None:
        self._thread.join(timeout=120)
        assert self.error is None, f"the stream alongside was cut: {self.error!r}"
        assert self.finish_reason == "length", "the stream alongside did not run to its end"


@contextlib.contextmanager
def survives(client: openai.OpenAI, model: str, probe_answer: str, max_tokens: int = 24) -> Iterator[Bystander]:
    """The block's bad requests must leave a concurrent stream and the probe untouched."""
    bystander = Bystander(client, model, max_tokens)
    bystander.wait_started()
    yield bystander
    bystander.join()
    assert probe(client, model) == probe_answer
