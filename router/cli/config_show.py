"""`mlxd config show`: the configuration `mlxd serve` would run with, as a config file whose
comments say where each value came from."""

from __future__ import annotations

import argparse
import sys

from router.cli.settings_flags import add_setting_flags, with_settings
from router.config_file import LoadedConfig, render_toml


def add_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "config",
        help="inspect the configuration",
        description="Settings come from defaults < the config file (HOME/config.toml or --config) < flags.",
    )
    config_commands = parser.add_subparsers(dest="config_command", metavar="SUBCOMMAND", required=True)
    show = config_commands.add_parser(
        "show",
        help="print the effective configuration as TOML",
        description="Print the configuration `mlxd serve` would run with, given the same config file "
                    "and flags, as a config file; each setting's comment says where its value came from.",
    )
    add_setting_flags(show)
    show.set_defaults(run=with_settings("config show", run))


def run(loaded: LoadedConfig, args: argparse.Namespace) -> int:
    sys.stdout.write(render_toml(loaded))
    return 0
