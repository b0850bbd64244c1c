"""Random and mutated frames on a real worker's socket (hypothesis): garbage, valid
msgpack of the wrong shape, and the router's own messages (add_request, count_tokens,
clear_cache, abort_request, ping) with fields swapped for values of any type. The worker
never dies, says why it refused, and afterwards answers a greedy request with the same
tokens as before the fuzzing."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import zmq
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from protocol.codec import decode, encode
from protocol.messages import (
    PROTOCOL_VERSION,
    AddRequest,
    ErrorEvent,
    EventBatch,
    FinishEvent,
    Hello,
    Ping,
    Pong,
    Ready,
    SamplingParams,
    TokenEvent,
    WorkerConfig,
)
from protocol.settings import WorkerSettings
from protocol.sockets import make_socket
from tests.fuzz_seed import FUZZ_SEED
from tests.fuzz_frames import frame_strategy

pytestmark = pytest.mark.timeout(600)
REPO = Path(__file__).resolve().parents[2]
IDENTITY = b"m#1"

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**64 - 1), st.floats(),
                    st.text(max_size=20), st.binary(max_size=20))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=10)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "tool", "x"]),
                                           "content": st.one_of(st.text(max_size=30), values)}), max_size=3)
sampling = st.dictionaries(st.sampled_from(["max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
                                            "repetition_penalty", "logit_bias", "logprobs", "top_logprobs"]),
                           st.one_of(st.integers(min_value=-5, max_value=70000), st.floats(), values), max_size=5)
request = st.fixed_dictionaries({}, optional={
    "request_id": st.one_of(st.sampled_from(["f1", "f2", "f3"]), values),
    "messages": st.one_of(messages, values),
    "prompt": st.one_of(st.text(max_size=30), st.lists(st.integers(min_value=-2, max_value=70000), max_size=5),
                        values),
    "tools": values, "sampling": st.one_of(sampling, values), "cache_salt": values,
    "context_limit": st.one_of(st.integers(min_value=-1, max_value=10), values),
    "constraint": st.one_of(st.fixed_dictionaries({"kind": st.sampled_from(["json_object", "json_schema", "lark",
                                                                            "x"]),
                                                   "source": st.text(max_size=30)}), values),
    "max_output_tokens": values, "continue_final_message": values, "want_progress": values,
})
bodies = st.tuples(st.sampled_from(["add_request", "count_tokens", "clear_cache", "abort_request", "ping", "token",
                                    "nonsense"]), request, values).map(
    lambda t: {**t[1], "type": t[0], "request": {**t[1], "type": "add_request"} if t[0] == "count_tokens" else t[2],
               "nonce": t[2], "sent_at": t[2]})


frames = frame_strategy(bodies, 32, 2)


@dataclass
class Worker:
    process: subprocess.Popen
    socket: zmq.Socket
    log: Path

    def send(self, parts: list[bytes]) -> None:
        self.socket.send_multipart([IDENTITY, *parts])

    def drain(self, seconds: float = 0.05) -> list:
        got = []
        while self.socket.poll(int(seconds * 1000)):
            _, *parts = self.socket.recv_multipart()
            message, _ = decode(parts)  # the worker's own messages always decode
            got.extend(message.events if isinstance(message, EventBatch) else [message])
        return got

    def greedy(self, request_id: str) -> list[int]:
        self.send(encode(AddRequest(request_id, messages=[{"role": "user", "content": "What is the capital of France?"}],
                                    sampling=SamplingParams(max_tokens=8, temperature=0.0))))
        tokens: list[int] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for event in self.drain(0.5):
                if getattr(event, "request_id", None) != request_id:
                    continue
                if isinstance(event, TokenEvent):
                    tokens.extend(event.token_ids)
                elif isinstance(event, FinishEvent):
                    return tokens
                elif isinstance(event, ErrorEvent):
                    raise AssertionError(event.message)
        raise AssertionError("no answer to a valid request")


@pytest.fixture(scope="module")
def worker(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    runtime = Path(tempfile.mkdtemp(prefix="wkf-", dir="/tmp"))
    address = f"ipc://{runtime}/w"
    sock = make_socket(zmq.Context.instance(), zmq.ROUTER, address, bind=True)
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    with open(log, "ab") as out:
        process = subprocess.Popen([sys.executable, "-m", "worker", "--connect", address, "--identity",
                                    IDENTITY.decode()], cwd=REPO, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert time.monotonic() < deadline and process.poll() is None, log.read_text()[-3000:]
            if not sock.poll(1000):
                continue
            _, *parts = sock.recv_multipart()
            message, _ = decode(parts)
            if isinstance(message, Hello):
                settings_ = WorkerSettings(max_output_tokens=4, max_num_seqs=4, batch_window_ms=0)
                sock.send_multipart([IDENTITY, *encode(WorkerConfig(PROTOCOL_VERSION, "m", str(default_model_dir),
                                                                    settings=settings_))])
            elif isinstance(message, Ready):
                break
        yield Worker(process, sock, log)
    finally:
        process.kill()
        process.wait(timeout=30)
        sock.close(linger=0)


@pytest.fixture(scope="module")
def before(worker: Worker) -> list[int]:
    return worker.greedy("before")


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@seed(FUZZ_SEED)
@given(sent=st.lists(frames, min_size=1, max_size=4))
def test_any_frames_leave_the_worker_alive(worker: Worker, before: list[int], sent: list[list[bytes]]) -> None:
    for parts in sent:
        worker.send(parts)
    worker.drain()
    assert worker.process.poll() is None, worker.log.read_text()[-3000:]


def test_after_the_fuzzing_it_answers_the_same_and_said_why(worker: Worker, before: list[int]) -> None:
    time.sleep(1.0)
    worker.drain(0.5)  # the fuzzed requests' last events
    worker.send(encode(Ping(nonce=7, sent_at=1.0)))
    assert any(isinstance(m, Pong) and m.nonce == 7 for m in worker.drain(2.0))
    assert worker.greedy("after") == before
    log = worker.log.read_text()
    assert worker.process.poll() is None
    assert "bad message" in log or "ignoring" in log or "dropped" in log, log[-2000:]
