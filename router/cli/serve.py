"""`mlxd serve`: the router process. Claims the home, binds the HTTP port before anything
loads, starts the kvstore and workers behind it, serves until SIGINT/SIGTERM and re-reads
its configuration on SIGHUP.

Its flags are generated from `RouterConfig`'s fields, so every setting is a flag with its
one line of why as help text; the same names are the config file's keys.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from protocol.errors import RequestError
from protocol.locks import FileLock, LockHeld, try_lock
from router import log_files
from router.api_keys import KeyState, key_ring
from router.cli.service_file import remove_service_file, write_service_file
from router.cli.settings_flags import add_setting_flags, describe_config_error, given_flags, with_settings
from router.config import RouterConfig
from router.config_file import LoadedConfig
from router.config_values import ConfigError
from router.children.kvstore_supervisor import KVStoreStartupError
from router.model_files import ModelNotFound, resolve_model
from router.children.pool import WorkerPool
from router.reload import Reloader, ReloadRefused
from router.server import RouterServer, make_server
from router.middleware.startup_gate import StartupState
from router.children.supervisor import DEFAULT_WORKER_COMMAND, WorkerStartupError

logger = logging.getLogger(__name__)

HOME_LOCK = "mlxd.lock"  # in the home; held by the serving router, names its PID
SEND_BUFFER_BYTES = 128 << 10


def add_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "serve",
        help="serve a model over HTTP (OpenAI API)",
        description="Load a model in a worker process and serve it at http://HOST:PORT/v1 "
                    "(OpenAI-compatible). Prints one 'mlxd ready on ...' line when it accepts requests.",
    )
    add_setting_flags(parser)
    parser.set_defaults(run=with_settings("serve", run))


def run(loaded: LoadedConfig, args: argparse.Namespace) -> int:
    return serve(loaded.config, given_flags(args))


def configure_logging(level: str, format_name: str = "text") -> None:
    """Once per process; the role (`router`) is on every line, uvicorn's included. Worker
    and kvstore log lines arrive formatted by the child and pass through as they are."""
    log_files.configure_router_logging(level, format_name)


def claim_home(home: Path) -> FileLock | None:
    """Make `home` private and lock it for this process's life; None (after saying why
    on stderr) if another mlxd serves it: two kvstores on one cache corrupt it.

    The home holds users' prompts (the SSD cache), hence 0700, also for a home an
    older version made world-readable."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    home.chmod(0o700)
    try:
        return try_lock(home / HOME_LOCK)
    except LockHeld as exc:
        holder = f"another mlxd (pid {exc.pid})" if exc.pid else "another mlxd"
        print(f"mlxd: {holder} is already serving home {home}; stop it first or use --home",
              file=sys.stderr)
        return None


def listen_socket(host: str, port: int) -> socket.socket:
    """Bind the HTTP port before loading the model, so a busy port fails in a second."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it. Without it, on a keep-alive connection (every
    # SDK client) each answer's second write waited for the client's delayed ACK:
    # ~40 ms per request (measured 44 ms for GET /v1/models, 1 ms with it).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # Inherited too: a fixed send buffer (Linux doubles it) instead of one the kernel grows
    # to 4 MiB, so a client that stops reading its stream fills it in a few hundred tokens
    # and stream_send_timeout_s cancels the request, rather than megabytes later.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock


async def run_router(config: RouterConfig, models: dict[str, Path],
                     worker_command: Sequence[str] = DEFAULT_WORKER_COMMAND,
                     flags: dict[str, Any] | None = None) -> int:
    """The router process: open the port, start the kvstore and workers (meanwhile /health
    says `starting` and requests wait), serve HTTP until SIGINT/SIGTERM, stop the workers.
    SIGHUP re-reads the configuration from `flags` (the command line's)."""
    try:
        keys = KeyState(key_ring(config))
    except ConfigError as exc:
        print(f"mlxd: error: {describe_config_error(exc)}", file=sys.stderr)
        return 2
    try:
        sock = listen_socket(config.host, config.port)
    except OSError as exc:
        print(f"mlxd: cannot listen on {config.host}:{config.port}: {exc.strerror or exc} "
              "(is another mlxd running? choose another --port)", file=sys.stderr)
        return 1
    loop = asyncio.get_running_loop()

    def on_signal(signum: int, frame: Any) -> None:
        # before uvicorn takes the signals over (and when it re-raises the one it handled)
        if server is not None:
            server.should_exit = True

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    pool = WorkerPool(config, models, worker_command)
    startup = StartupState(timeout_s=config.load_timeout_s, accepting=pool.accepting)
    server: RouterServer | None = None
    reloader = Reloader(flags if flags is not None else {}, pool, keys,
                        lambda new: setattr(server.config.app.state, "config", new) if server else None)
    loop.add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(_reload_on_signal(reloader)))
    try:
        server = make_server(config, pool, keys, reloader, startup)
        starting = asyncio.ensure_future(pool.start())
        serving = asyncio.ensure_future(server.serve(sockets=[sock]))
        announced = False
        while not (starting.done() or serving.done()):
            if server.started and not announced:  # the port is open: `mlxd status` can find it
                write_service_file(config.home, config.host, config.port)
                announced = True
            await asyncio.wait({starting, serving}, timeout=0.05, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():  # SIGINT/SIGTERM while loading: uvicorn has stopped
            logger.info("interrupted while loading; stopping")
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            return 130
        try:
            starting.result()
        except (WorkerStartupError, KVStoreStartupError, RequestError) as exc:
            startup.finish(str(exc))
            interrupted = server.should_exit  # the shutdown stopped the load under way
            if not interrupted:
                print(f"mlxd: {exc}", file=sys.stderr)
            server.should_exit = True
            await serving
            return 130 if interrupted else 1
        startup.finish()
        while not server.started and not serving.done():
            await asyncio.sleep(0.05)
        if server.started:
            if not announced:
                write_service_file(config.home, config.host, config.port)
            host = f"[{config.host}]" if ":" in config.host else config.host
            print(f"mlxd ready on http://{host}:{config.port} (model {', '.join(models)})", flush=True)
        await serving
        return 0 if server.started else 1
    finally:
        remove_service_file(config.home)
        loop.remove_signal_handler(signal.SIGHUP)
        await pool.stop()
        sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


async def _reload_on_signal(reloader: Reloader) -> None:
    """SIGHUP: a refused file is logged, and the service runs on as it was."""
    try:
        await reloader.reload()
    except ReloadRefused as exc:
        logger.error("reload refused, the running configuration stays: %s", exc)


def serve(config: RouterConfig, flags: dict[str, Any] | None = None) -> int:
    configure_logging(config.log_level, config.log_format)
    os.umask(0o077)  # before anything is written; the worker and kvstore inherit it
    try:
        home_lock = claim_home(config.home)
    except OSError as exc:
        print(f"mlxd: cannot use home {config.home}: {exc.strerror or exc} (check --home)", file=sys.stderr)
        return 1
    if home_lock is None:
        return 1
    with home_lock:
        try:
            log_files.open_router_log(config)
        except OSError as exc:
            print(f"mlxd: cannot write the log file: {exc} (check --log-dir, or --no-log-files)", file=sys.stderr)
            return 1
        if config.config is not None:
            logger.info("settings from %s (then flags)", config.config)
        try:
            model_id, path = resolve_model(config)
        except ModelNotFound as exc:
            print(f"mlxd: {exc}", file=sys.stderr)
            return 1
        return asyncio.run(run_router(config, {model_id: path}, flags=flags))


