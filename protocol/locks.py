"""Exclusive, crash-safe ownership of a directory: an flock on a lock file holding the PID.

The kernel drops an flock when its holder dies, even by SIGKILL, so a crash never leaves
a stale lock behind; the PID in the file is only there to name the holder in a refusal.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

_PID_WAIT_S = 0.5  # a holder writes its PID just after locking; give it that long


class LockHeld(Exception):
    """Another live process holds the lock; `pid` is its PID when the file names one."""

    def __init__(self, path: Path, pid: int | None) -> None:
        super().__init__(f"{path} is locked by {'pid ' + str(pid) if pid else 'another process'}")
        self.path = path
        self.pid = pid


class FileLock:
    """An flock held on `path` until `release()` or this process's exit.

    The descriptor is close-on-exec and not inheritable: a child that outlived us must
    not keep our lock (an flock belongs to the open file, shared by every inheritor).
    """

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> FileLock:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def release(self) -> None:
        """Close the descriptor, which drops the lock; the file stays (unlinking it would
        let a waiter lock a file that a newcomer then replaces)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def try_lock(path: Path | str, *, create: bool = True, write_pid: bool = True) -> FileLock:
    """Lock `path` without waiting; raise `LockHeld` if a live process holds it.

    With `create`, a missing file is created 0600 (else FileNotFoundError). With
    `write_pid`, our PID replaces the file's content once the lock is ours.
    """
    path = Path(path)
    flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _holder_pid(fd)
        os.close(fd)
        raise LockHeld(path, pid) from None
    except BaseException:
        os.close(fd)
        raise
    os.set_inheritable(fd, False)
    if write_pid:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return FileLock(path, fd)


def _holder_pid(fd: int) -> int | None:
    deadline = time.monotonic() + _PID_WAIT_S
    while True:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        if text.isdigit():
            return int(text)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)
