"""`mlxd convert SRC.gguf DEST_DIR`: a GGUF file into an MLX model directory, by the model
tools in a child process (the router never imports them). Reads no settings."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from router.model_files import gguf_command

CONVERT_DTYPES = ("native", "float32", "float16", "bfloat16")


def add_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "convert",
        help="convert a .gguf file into an MLX model directory",
        description="Convert SRC.gguf into an MLX model directory DEST_DIR (weights, config, tokenizer, "
                    "chat template). Exits with the converter's status.",
    )
    parser.add_argument("src", metavar="SRC.gguf", help="the GGUF file to convert")
    parser.add_argument("dest", metavar="DEST_DIR", help="the MLX model directory to write")
    parser.add_argument("--dtype", choices=CONVERT_DTYPES, default=None,
                        help="dtype of the written weights; native keeps the file's own "
                             "quantization where MLX can read it (default: native)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return convert(args.src, args.dest, args.dtype)


def convert(src: str, dest: str, dtype: str | None) -> int:
    if not Path(src).is_file():
        print(f"mlxd convert: no such file: {src}", file=sys.stderr)
        return 1
    try:
        return subprocess.call(gguf_command(src, dest, dtype), stdin=subprocess.DEVNULL)
    except KeyboardInterrupt:
        return 130
