"""A stand-in worker for router tests: speaks the real protocol, needs no MLX.

Run as `python fake_worker.py --connect ADDR --identity ID`. It answers every request
with the words of FAKE_REPLY, one TokenEvent each. Behaviour switches:
- env FAKE_WORKER_START: "fail" (StartupFailed), "die" (exit 7 before READY),
  "old_protocol" (Hello with a wrong version), "slow" (READY after 30 s); or the
  content of the file named by FAKE_WORKER_START_FILE, read at each start; env
  FAKE_WORKER_LOAD_S: seconds before READY
- the last message / prompt text: "CRASH" (exit mid-stream), "HANG" (stop answering
  anything, pings included), "TOOLONG" (ErrorEvent 400), "SLOW" (first token after
  FAKE_WORKER_SLOW_S seconds), "STOP" (finish_reason "length" after 2 tokens), "TOOLCALL"
  (TOOL_REPLY: text and two calls in the Hermes markup, markers split across tokens),
  "WRITTENCALL" (WRITTEN_REPLY: a call written as text, a heading then the arguments)
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import zmq

from protocol.codec import decode, encode
from protocol.messages import (
    PROTOCOL_VERSION,
    AbortRequest,
    AddRequest,
    ErrorEvent,
    EventBatch,
    FinishEvent,
    Hello,
    Ping,
    Pong,
    PromptEvent,
    Ready,
    Shutdown,
    StartupFailed,
    TokenEvent,
    Usage,
    WorkerConfig,
)

FAKE_REPLY = "Hello from the fake worker ."
TOOL_REPLY = ["I will check.", "\n<tool", '_call>\n{"name": "get_', 'weather", "arguments": {"city": ',
              '"Paris"}}\n</tool_call>', '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}',
              "\n</tool_call>"]
WRITTEN_REPLY = ["# get_", 'weather\n{"city": ', '"Paris"}']
TOKEN_INTERVAL_S = 0.01


def _text_of(add: AddRequest) -> str:
    if add.messages:
        return str(add.messages[-1].get("content", ""))
    return add.prompt if isinstance(add.prompt, str) else " ".join(map(str, add.prompt or []))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--connect", required=True)
    parser.add_argument("--identity", required=True)
    args = parser.parse_args()
    start_mode = os.environ.get("FAKE_WORKER_START", "")
    mode_file = os.environ.get("FAKE_WORKER_START_FILE")
    if mode_file and os.path.exists(mode_file):  # lets a test change how restarts behave
        start_mode = open(mode_file).read().strip()
    parent = os.getppid()

    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, args.identity.encode())
    sock.connect(args.connect)

    def send(message) -> None:
        sock.send_multipart(encode(message))

    version = PROTOCOL_VERSION + 1 if start_mode == "old_protocol" else PROTOCOL_VERSION
    send(Hello(protocol_version=version, role="worker", pid=os.getpid()))
    config, _ = decode(sock.recv_multipart())
    assert isinstance(config, WorkerConfig), config
    print(f"fake worker {args.identity} loading {config.model_path}", flush=True)
    time.sleep(float(os.environ.get("FAKE_WORKER_LOAD_S", "0")))  # a load that takes a while (then the mode)
    if start_mode == "die":
        print("fake worker: about to die before READY", flush=True)
        return 7
    if start_mode == "fail":
        send(StartupFailed(message="no weights in that directory (fake)"))
        return 1
    if start_mode == "slow":
        time.sleep(30)
    send(Ready(protocol_version=PROTOCOL_VERSION, model_id=config.model_id, context_length=2048,
               max_num_seqs=config.settings.max_num_seqs, prefill_chunk_tokens=config.settings.prefill_chunk_tokens,
               block_tokens=config.settings.block_tokens, dtype="float32", device="cpu", blas="fake",
               load_time_s=0.01, weights_bytes=0))

    active: dict[str, dict] = {}
    while True:
        if os.getppid() != parent:
            return 0  # the router died
        if sock.poll(5):
            message, _ = decode(sock.recv_multipart())
            if isinstance(message, Ping):
                send(Pong(nonce=message.nonce, sent_at=message.sent_at, num_running=len(active)))
            elif isinstance(message, Shutdown):
                print("fake worker: shutdown", flush=True)
                return 0
            elif isinstance(message, AbortRequest):
                print(f"fake worker: aborted {message.request_id}", flush=True)
                active.pop(message.request_id, None)
            elif isinstance(message, AddRequest):
                text = _text_of(message)
                if "TOOLONG" in text:
                    send(ErrorEvent(request_id=message.request_id, status=400, code="context_length_exceeded",
                                    param="messages", message="prompt is 9000 tokens, the context window 2048"))
                    continue
                send(PromptEvent(request_id=message.request_id, prompt_tokens=len(text.split()), cached_tokens=1))
                delay = float(os.environ.get("FAKE_WORKER_SLOW_S", "1.5")) if "SLOW" in text else 0.0
                tool = "TOOLCALL" in text or "WRITTENCALL" in text
                words = TOOL_REPLY if "TOOLCALL" in text else WRITTEN_REPLY if tool else FAKE_REPLY.split()
                active[message.request_id] = {"add": message, "words": words,
                                              "sent": 0, "next_at": time.monotonic() + delay, "text": text,
                                              "exact": tool}
        now = time.monotonic()
        step: list = []  # this tick's events go out as one batch, as the real worker's do
        for rid, state in list(active.items()):
            if now < state["next_at"]:
                continue
            if "CRASH" in state["text"] and state["sent"] == 2:
                print("fake worker: crashing on purpose", flush=True)
                os._exit(3)
            if "HANG" in state["text"] and state["sent"] == 2:
                print("fake worker: hanging on purpose", flush=True)
                time.sleep(3600)
            limit = 2 if "STOP" in state["text"] else len(state["words"])
            if state["sent"] < limit:
                word = state["words"][state["sent"]]
                spaced = state["sent"] > 0 and not state["exact"]
                step.append(TokenEvent(request_id=rid, text=" " + word if spaced else word,
                                       token_ids=[state["sent"]]))
                state["sent"] += 1
                state["next_at"] = now + TOKEN_INTERVAL_S
            else:
                step.append(FinishEvent(request_id=rid, finish_reason="length" if limit == 2 else "stop",
                                        usage=Usage(prompt_tokens=len(state["text"].split()),
                                                    completion_tokens=state["sent"], cached_tokens=1)))
                del active[rid]
        if len(step) == 1:
            send(step[0])
        elif step:
            send(EventBatch(events=step))


if __name__ == "__main__":
    sys.exit(main())
