"""The `mlxd` command: `serve` (the router process) and `convert` (GGUF -> MLX directory).

`serve` flags are generated from `RouterConfig`'s fields, so every setting is a flag
with its one line of why as help text.
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

from router.config import ConfigError, RouterConfig, make_config, setting_types
from router.model_files import ModelNotFound, gguf_command, resolve_model
from router.pool import WorkerPool
from router.server import make_server
from router.supervisor import DEFAULT_WORKER_COMMAND, WorkerStartupError

logger = logging.getLogger(__name__)

CONVERT_DTYPES = ("native", "float32", "float16", "bfloat16")
API_KEY_ENV = "MLXD_API_KEY"


def version() -> str:
    try:
        return importlib.metadata.version("mlxd")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def flag_name(key: str) -> str:
    return "--" + key.replace("_", "-")


def _metavar(key: str, kind: type) -> str:
    if kind is int:
        return "N"
    if kind is float:
        return "SECONDS" if key.endswith("_s") else "X"
    return {"api_key": "KEY", "home": "DIR", "model_dir": "DIR", "model": "MODEL"}.get(key, key.upper())


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    types = setting_types()
    for f in dataclasses.fields(RouterConfig):
        kind = types[f.name]
        help_text = f.metadata["help"]
        if f.default is not dataclasses.MISSING and f.default is not None:
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
            default=argparse.SUPPRESS,  # only flags given on the command line override
            metavar=None if f.metadata.get("choices") else _metavar(f.name, kind),
            help=help_text,
        )


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
    return parser


def config_from_args(args: argparse.Namespace) -> RouterConfig:
    """Defaults < CLI flags (a config file will slot in between). Raises ConfigError."""
    overrides: dict[str, Any] = {k: v for k, v in vars(args).items() if k != "command"}
    if "api_key" not in overrides and os.environ.get(API_KEY_ENV):
        overrides["api_key"] = os.environ[API_KEY_ENV]  # keeps the key out of `ps` output
    return make_config(overrides)


def configure_logging(level: str) -> None:
    """Once per process; the role (`router`) is on every line, uvicorn's included.
    Worker output arrives already formatted by the worker, prefixed by its identity."""
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s router %(name)s: %(message)s",
                        stream=sys.stderr)


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
        except WorkerStartupError as exc:
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "convert":
        return convert(args.src, args.dest, args.dtype)
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"mlxd serve: error: {flag_name(exc.key)}: {exc.message}", file=sys.stderr)
        return 2
    return serve(config)

