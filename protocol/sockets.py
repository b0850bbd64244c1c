"""Where the ipc:// sockets live and how each side opens them.

Paths stay short (macOS caps a socket path at ~104 bytes), inside a private 0700
runtime directory so no other local user can talk to the worker. A router holds a lock
in its runtime directory for its life, so a later router can sweep away the directories
of routers that died without cleaning up (SIGKILL) and never those of live ones.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import socket
import stat
import tempfile
import time
from pathlib import Path

import zmq

from protocol.locks import FileLock, LockHeld, try_lock

log = logging.getLogger(__name__)

RUNTIME_LOCK = "owner.lock"  # locked by the router using the dir, for its life
_UNLOCKED_GRACE_S = 60.0  # a dir without a lock file younger than this may be being made
_MKDTEMP_SUFFIX = re.compile(r"[a-z0-9_]{8}")  # what tempfile.mkdtemp appends to the prefix


def runtime_base() -> Path:
    """The directory runtime dirs are made in: $XDG_RUNTIME_DIR, else the temp dir."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    if len(base) > 40:  # keep room for the socket names under the ~104 byte cap
        base = "/tmp"
    return Path(base)


def make_runtime_dir(prefix: str = "mlxd-") -> Path:
    """A fresh private directory for this service's sockets (mode 0700)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=runtime_base()))
    path.chmod(0o700)
    return path


def claim_runtime_dir(prefix: str = "mlxd-") -> tuple[Path, FileLock]:
    """A fresh runtime dir locked by this process until the lock is released or the
    process dies; then the dirs of dead owners are removed (`remove_stale_runtime_dirs`)."""
    path = make_runtime_dir(prefix)
    # locked under another name, then renamed: a sweeper never sees the lock file unlocked
    lock = try_lock(path / f".{RUNTIME_LOCK}.new")
    os.rename(lock.path, path / RUNTIME_LOCK)
    lock.path = path / RUNTIME_LOCK
    remove_stale_runtime_dirs(path.parent, prefix, keep=path)
    return path, lock


def remove_stale_runtime_dirs(base: Path, prefix: str = "mlxd-", keep: Path | None = None) -> list[Path]:
    """Remove this user's `prefix*` runtime dirs in `base` whose owner is gone; returns them.

    Gone means: its lock file can be locked (its router died), or, for a dir from a
    version without lock files, no lock file, older than a minute and no socket in it
    accepting connections. Dirs of other users, symlinks, and anything holding more than
    sockets and the lock file (not a runtime dir: maybe someone's data) are never touched.
    """
    removed = []
    for path in sorted(base.glob(f"{prefix}*")):
        if path == keep or not _MKDTEMP_SUFFIX.fullmatch(path.name[len(prefix):]):
            continue
        try:
            info = path.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or not _only_sockets(path):
                continue
            if _remove_if_unowned(path, info.st_mtime):
                removed.append(path)
                log.info("removed %s: the router that made it is gone", path)
        except OSError as exc:  # vanished meanwhile, or unreadable: not ours to judge
            log.debug("left %s alone: %s", path, exc)
    return removed


def _only_sockets(path: Path) -> bool:
    for entry in os.scandir(path):
        if entry.name in (RUNTIME_LOCK, f".{RUNTIME_LOCK}.new"):
            continue
        if not stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
            return False
    return True


def _remove_if_unowned(path: Path, mtime: float) -> bool:
    try:
        lock = try_lock(path / RUNTIME_LOCK, create=False, write_pid=False)
    except LockHeld:
        return False  # a live router
    except FileNotFoundError:
        if time.time() - mtime < _UNLOCKED_GRACE_S or _has_live_socket(path):
            return False
        shutil.rmtree(path)
        return True
    with lock:  # held while removing, so no other sweeper judges it meanwhile
        shutil.rmtree(path)
    return True


def _has_live_socket(path: Path) -> bool:
    """Whether any socket in `path` accepts a connection (a process still serves it)."""
    for entry in os.scandir(path):
        if not stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
            continue
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(1.0)
            with contextlib.suppress(OSError):
                probe.connect(entry.path)
                return True
    return False


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
