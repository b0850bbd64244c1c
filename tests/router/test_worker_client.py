"""The router's worker socket survives any one message: encode failures are the caller's
400, send failures fail that request only, and a task that dies is restarted."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from protocol.codec import decode
from protocol.errors import RequestError, WorkerDead
from protocol.messages import AddRequest, SamplingParams
from protocol.sockets import ipc_address, make_socket
from router.children.worker_client import WorkerClient

pytestmark = pytest.mark.timeout(30)


def add(rid: str, content: str = "hi", **sampling: object) -> AddRequest:
    return AddRequest(rid, messages=[{"role": "user", "content": content}], sampling=SamplingParams(**sampling))


async def connected(tmp_path: Path) -> tuple[WorkerClient, zmq.asyncio.Socket]:
    client = WorkerClient(ipc_address(tmp_path, "w"))
    await client.start()
    peer = make_socket(zmq.asyncio.Context.instance(), zmq.DEALER, client.address, bind=False, identity=b"m#1")
    await peer.send_multipart([b"hello?"])  # the ROUTER learns the identity from any frame
    await asyncio.sleep(0.1)
    return client, peer


async def received(peer: zmq.asyncio.Socket) -> str:
    assert await peer.poll(2000), "nothing reached the worker"
    message, _ = decode(await peer.recv_multipart())
    return message.request_id


@pytest.mark.parametrize("bad", [
    add("bad", content="\ud800"),
    add("bad", max_tokens=2**64),
    AddRequest("bad", tools=[{"n": 2**70}], messages=[]),
])
def test_a_request_the_codec_refuses_is_a_400_and_the_writer_lives(tmp_path: Path, bad: AddRequest) -> None:
    async def run() -> None:
        client, peer = await connected(tmp_path)
        try:
            with pytest.raises(RequestError) as excinfo:
                client.open_request(b"m#1", bad)
            assert excinfo.value.status == 400
            assert client.num_open_requests() == 0
            client.open_request(b"m#1", add("good"))
            assert await received(peer) == "good"
        finally:
            peer.close(linger=0)
            await client.close()

    asyncio.run(run())


def test_a_send_that_raises_fails_only_that_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def run() -> None:
        client, peer = await connected(tmp_path)
        assert client._socket is not None
        real_send = client._socket.send_multipart
        calls = {"n": 0}

        async def flaky_send(parts: list, *args: object, **kwargs: object) -> None:
            calls["n"] += 1
            if calls["n"] == 1:
                raise ValueError("boom")
            await real_send(parts, *args, **kwargs)

        monkeypatch.setattr(client._socket, "send_multipart", flaky_send)
        try:
            doomed = client.open_request(b"m#1", add("doomed"))
            with pytest.raises(WorkerDead):
                await asyncio.wait_for(doomed.next_event(), 2)
            client.open_request(b"m#1", add("next"))
            assert await received(peer) == "next"
        finally:
            peer.close(linger=0)
            await client.close()

    asyncio.run(run())


def test_a_socket_task_that_dies_is_restarted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def run() -> None:
        client = WorkerClient(ipc_address(tmp_path, "w"))
        real_write = client._write
        calls = {"n": 0}

        async def dying_write() -> None:
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("a bug in the writer")
            await real_write()

        monkeypatch.setattr(client, "_write", dying_write)
        await client.start()
        peer = make_socket(zmq.asyncio.Context.instance(), zmq.DEALER, client.address, bind=False,
                           identity=b"m#1")
        try:
            await peer.send_multipart([b"hello?"])
            await asyncio.sleep(0.1)
            assert client.num_task_restarts == 1
            client.open_request(b"m#1", add("after"))
            assert await received(peer) == "after"
        finally:
            peer.close(linger=0)
            await client.close()

    asyncio.run(run())
