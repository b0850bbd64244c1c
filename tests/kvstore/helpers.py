"""Shared by the kvstore tests: block keys and payloads, disk usage, the real process."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import zmq

from protocol.block_keys import KEY_BYTES
from protocol.codec import decode, encode
from protocol.messages import KVPut, Message
from protocol.sockets import ipc_address, make_socket

REPO = Path(__file__).resolve().parents[2]


def key(i: int, salt: str = "") -> bytes:
    return hashlib.blake2b(f"{salt}{i}".encode(), digest_size=KEY_BYTES).digest()


def payload(i: int, size: int = 4096) -> bytes:
    """Half random (incompressible), half a pattern (compressible): both lz4 paths run."""
    rand = hashlib.shake_128(f"payload{i}".encode()).digest(size // 2)
    return rand + bytes([i % 251]) * (size - size // 2)


def disk_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def num_segment_files(root: Path) -> int:
    return len(list((root / "segments").glob("seg-*.log")))


class KVClient:
    """A DEALER peer of the kvstore, as a worker would hold one."""

    def __init__(self, address: str) -> None:
        self.context = zmq.Context()
        self.socket = make_socket(self.context, zmq.DEALER, address, bind=False)
        self._next_id = 0

    def next_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def send(self, message: Message, frames: Sequence[bytes] = ()) -> None:
        self.socket.send_multipart(encode(message, frames))

    def receive(self, timeout_s: float = 10.0) -> tuple[Message, list[bytes]]:
        if not self.socket.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"no message within {timeout_s}s")
        answer, frames = decode(self.socket.recv_multipart())
        return answer, [bytes(f) for f in frames]

    def ask(self, message: Message, timeout_s: float = 10.0) -> tuple[Message, list[bytes]]:
        self.send(message)
        if not self.socket.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"no answer to {message.type} within {timeout_s}s")
        answer, frames = decode(self.socket.recv_multipart())
        assert answer.request_id == message.request_id
        return answer, [bytes(f) for f in frames]

    def put(self, namespace: str, items: Sequence[tuple[bytes, bytes]]) -> None:
        self.send(KVPut(namespace, [k for k, _ in items]), [p for _, p in items])

    def close(self) -> None:
        self.socket.close(linger=0)
        self.context.term()


class KVProcess:
    """`python -m kvstore` on a short ipc path; restartable on the same root."""

    def __init__(self, root: Path, runtime: Path, *extra: str) -> None:
        self.root = root
        self.address = ipc_address(runtime, "kv")
        self.extra = extra
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = root.parent / "kvstore.log"

    def start(self) -> KVProcess:
        socket_path = Path(self.address.removeprefix("ipc://"))
        socket_path.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "kvstore", "--bind", self.address, "--root", str(self.root),
                "--segment-bytes", "256KiB", "--max-disk-bytes", "16MiB", *self.extra]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(argv, cwd=REPO, stderr=log)
        deadline = time.monotonic() + 15
        while not socket_path.exists():
            if self.process.poll() is not None:
                raise RuntimeError(f"kvstore exited with {self.process.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError("kvstore did not bind in time")
            time.sleep(0.02)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> int:
        assert self.process is not None
        self.process.send_signal(signum)
        return self.process.wait(timeout=15)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
