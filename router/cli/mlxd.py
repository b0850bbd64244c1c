"""The `mlxd` command: the top parser, to which each subcommand's module adds its own
subparser and handler (`add_command`), and `main`, which parses and runs the handler."""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from collections.abc import Sequence

from router.cli import (
    cache,
    config_show,
    convert,
    launch,
    logs,
    models,
    pull,
    serve,
    service,
    status,
    wait,
)

# in the order `mlxd --help` lists them
COMMANDS = (serve, config_show, convert, pull, models, service, status, wait, cache, logs, launch)


def version() -> str:
    try:
        return importlib.metadata.version("mlxd")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlxd",
        description="Local LLM inference service on MLX with an OpenAI-compatible API.",
    )
    parser.add_argument("--version", action="version", version=f"mlxd {version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.add_command(commands)
    return parser


def split_client_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """`mlxd launch CLIENT [flags] -- ARGS`: (mlxd's arguments, the client's). argparse would
    read the client's options (`-p`, `--model`) as its own, so they are cut off first."""
    argv = list(argv)
    if argv[:1] == ["launch"] and "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1:]
    return argv, []


def main(argv: Sequence[str] | None = None) -> int:
    own, client_args = split_client_args(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(own)
    if client_args:
        args.client_args = [*args.client_args, *client_args]
    return args.run(args)
