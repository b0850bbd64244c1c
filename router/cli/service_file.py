"""`HOME/service.json`: where the service that holds the home's lock listens, so the
shell commands (`mlxd status`, `mlxd cache`, `mlxd service status`) find it without being
told its address: one service per home, and the home names it.

Written (atomically) once the port is open, removed at a clean exit. A file left by a
killed service names a dead PID, which `find_service` checks, so it is never trusted stale.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from protocol.atomic_files import write_atomically
from router.config import RouterConfig

SERVICE_FILE = "service.json"


@dataclass(frozen=True)
class ServiceInfo:
    pid: int
    url: str  # where a client on this machine reaches it (loopback for a wildcard bind)
    host: str
    port: int
    started: float


def local_url(host: str, port: int) -> str:
    """The URL a client on this machine uses for a service bound to `host`:`port`."""
    if host in ("0.0.0.0", "::", ""):  # listening everywhere: ask on loopback
        host = "127.0.0.1"
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def write_service_file(home: Path, host: str, port: int) -> Path:
    info = ServiceInfo(os.getpid(), local_url(host, port), host, port, time.time())
    path = home / SERVICE_FILE
    write_atomically(path, json.dumps(asdict(info)).encode())
    return path


def remove_service_file(home: Path) -> None:
    """At exit, only if the file is still ours (a newer service may have replaced it)."""
    info = read_service_file(home)
    if info is not None and info.pid == os.getpid():
        (home / SERVICE_FILE).unlink(missing_ok=True)


def read_service_file(home: Path) -> ServiceInfo | None:
    try:
        return ServiceInfo(**json.loads((home / SERVICE_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def find_service(home: Path) -> ServiceInfo | None:
    """The service serving `home`, if one is running: its file names a live mlxd process."""
    info = read_service_file(home)
    if info is None:
        return None
    try:
        process = psutil.Process(info.pid)
        alive = process.status() != psutil.STATUS_ZOMBIE and any(
            "mlxd" in part or "router" in part for part in process.cmdline())
    except psutil.Error:
        return None
    return info if alive else None


def service_url(config: RouterConfig) -> str:
    """Where the service serving `config.home` listens, as its home names it (it may run
    on another port than this shell's configuration says); else the configured address."""
    running = find_service(config.home)
    return running.url if running is not None else local_url(config.host, config.port)
