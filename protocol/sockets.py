"""Where the ipc:// sockets live and how each side opens them.

Paths stay short (macOS caps a socket path at ~104 bytes), inside a private 0700
runtime directory so no other local user can talk to the worker.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import zmq


def make_runtime_dir(prefix: str = "mlxd-") -> Path:
    """A fresh private directory for this service's sockets (mode 0700)."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    if len(base) > 40:  # keep room for the socket names under the ~104 byte cap
        base = "/tmp"
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    path.chmod(0o700)
    return path


def ipc_address(runtime_dir: Path | str, name: str) -> str:
    """ipc:// address of socket `name` in the runtime dir; checks the length cap."""
    address = f"ipc://{Path(runtime_dir) / name}"
    if len(address) > 100:
        raise ValueError(f"ipc socket path too long ({len(address)} bytes): {address}")
    return address


def make_socket(
    context: zmq.Context,
    kind: int,
    address: str,
    *,
    bind: bool,
    identity: bytes | None = None,
) -> zmq.Socket:
    """Open a socket that never blocks process exit on unsent messages."""
    sock = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    if kind == zmq.ROUTER:
        # a restarted peer may reuse its identity; let the new connection take it over
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    if bind:
        sock.bind(address)
    else:
        sock.connect(address)
    return sock
