"""The command line: the `mlxd` command (`python -m router`), one module per subcommand,
each adding its own subparser and handler to the parser of `mlxd.py`.

serve: the router process. config_show, convert, pull, models (list, rm): the
configuration and the models directory. service (+ service_units: launchd and systemd
files), status, wait, cache, logs (+ log_records), launch (+ launch_service,
launch_clients): the shell commands around a running service, which they find through
service_file. settings_flags makes the settings flags; tables formats for people.
"""

from router.cli.mlxd import main

__all__ = ["main"]
