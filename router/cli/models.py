"""`mlxd models list` and `mlxd rm`: the models directory from the shell (`mlxd pull` fills
it: router/cli/pull.py). Whether a model is loaded comes from the running service's
/admin/status."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import urllib.error
from pathlib import Path
from typing import Any

from router.cli.settings_flags import CLIENT_SETTINGS, add_setting_flags, with_settings
from router.cli.status import fetch_status
from router.cli.service_file import service_url
from router.cli.tables import size, table
from router.config import RouterConfig
from router.config_file import LoadedConfig
from router.model_inventory import (
    STAGING_PREFIX,
    ModelOnDisk,
    PartialPull,
    partial_pulls,
    scan,
    size_on_disk,
)

UNLOADED = "unloaded"  # the state /admin/status gives a model no worker holds


def add_command(commands: argparse._SubParsersAction) -> None:
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
    add_setting_flags(models_list, only=(*CLIENT_SETTINGS, "model_dir"))
    models_list.set_defaults(run=with_settings("models", run_list))
    rm = commands.add_parser(
        "rm",
        help="remove a model from disk",
        description="Remove model NAME from --model-dir (its directory, its .gguf, an unfinished pull of it). "
                    "Refused while the running service has it loaded; asks first unless --yes.",
    )
    rm.add_argument("name", metavar="NAME", help="the model's name, as `mlxd models list` shows it")
    rm.add_argument("-y", "--yes", dest="yes", action="store_true", help="do not ask")
    add_setting_flags(rm, only=(*CLIENT_SETTINGS, "model_dir"))
    rm.set_defaults(run=with_settings("rm", run_rm))


def run_list(loaded: LoadedConfig, args: argparse.Namespace) -> int:
    return list_command(loaded.config, args.as_json)


def run_rm(loaded: LoadedConfig, args: argparse.Namespace) -> int:
    return rm_command(loaded.config, args.name, args.yes)


def loaded_states(config: RouterConfig) -> dict[str, str]:
    """Model id -> state, from the running service. Raises OSError when none answers
    (urllib's HTTPError, an OSError too, when one answers but refuses)."""
    try:
        status = fetch_status(config)
    except ValueError as exc:  # an answer that is not JSON, or a bad key setting
        raise OSError(str(exc)) from exc
    return {str(m.get("id")): str(m.get("state")) for m in status.get("models") or []}


def list_command(config: RouterConfig, as_json: bool) -> int:
    """`mlxd models list [--json]`; never fails for want of a service: "-" then."""
    models = scan(config.models_dir)
    partial = partial_pulls(config.models_dir)
    try:
        states: dict[str, str] | None = loaded_states(config)
    except OSError:
        states = None
    if as_json:
        sys.stdout.write(json.dumps(_as_json(config, models, partial, states), indent=2) + "\n")
        return 0
    if not models:
        print(f"no models in {config.models_dir} (`mlxd pull NAME` fetches one)")
    else:
        rows = [["NAME", "SIZE", "KIND", "QUANTIZATION", "LOADED", "SOURCE"]]
        rows += [[m.name, size(m.size_bytes), m.kind, m.quantization, _loaded_cell(m.name, states),
                  m.source or "-"] for m in models]
        print("\n".join(table(rows)))
    for p in partial:
        print(f"unfinished pull: {p.name} ({size(p.size_bytes)} so far; the same `mlxd pull` continues it, "
              f"`mlxd rm {p.name}` drops it)")
    return 0


def rm_command(config: RouterConfig, name: str, yes: bool) -> int:
    """`mlxd rm NAME`: the model's directory (and its .gguf, and an unfinished pull of it),
    refused while the running service has it loaded."""
    paths = _paths_of(config.models_dir, name)
    if not paths:
        on_disk = [m.name for m in scan(config.models_dir)] + [p.name for p in partial_pulls(config.models_dir)]
        print(f"mlxd rm: no model {name!r} in {config.models_dir}; on disk: {', '.join(on_disk) or 'none'}",
              file=sys.stderr)
        return 1
    url = service_url(config)
    try:
        state = loaded_states(config).get(name, UNLOADED)
    except urllib.error.HTTPError as exc:
        print(f"mlxd rm: the service at {url} answered {exc.code}, so whether it has {name} loaded is unknown; "
              "set the admin key (--admin-key or $MLXD_ADMIN_KEY) or stop the service", file=sys.stderr)
        return 1
    except OSError:
        state = UNLOADED  # no service: nothing can have it loaded
    if state != UNLOADED:
        print(f"mlxd rm: {name} is {state} in the service at {url}; unload it first "
              f"(curl -X POST {url}/admin/models/{name}/unload) or stop the service", file=sys.stderr)
        return 1
    if not yes and not _confirm(name, paths):
        return 2
    for path in paths:
        _remove(path)
        print(path)
    return 0


def _paths_of(models_dir: Path, name: str) -> list[Path]:
    """Every form of model `name` on disk: its directory, its .gguf, an unfinished pull."""
    if not name or name.startswith(".") or "/" in name or name in ("..", "."):
        return []
    candidates = [models_dir / name, models_dir / f"{name}.gguf", models_dir / f"{STAGING_PREFIX}{name}"]
    return [p for p in candidates if p.exists() or p.is_symlink()]


def _confirm(name: str, paths: list[Path]) -> bool:
    if not sys.stdin.isatty():
        print(f"mlxd rm: pass --yes to remove {name} without a question", file=sys.stderr)
        return False
    total = sum(size_on_disk(p) for p in paths if not p.is_symlink())
    answer = input(f"remove {', '.join(str(p) for p in paths)} ({size(total)})? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def _remove(path: Path) -> None:
    """A directory leaves the models directory by one rename, then is deleted: the service
    never discovers a half-deleted model."""
    if path.is_dir() and not path.is_symlink():
        doomed = path.with_name(f".{path.name}.removing")
        shutil.rmtree(doomed, ignore_errors=True)
        os.rename(path, doomed)
        shutil.rmtree(doomed)
    else:
        path.unlink()


def _loaded_cell(name: str, states: dict[str, str] | None) -> str:
    if states is None:
        return "-"
    state = states.get(name, UNLOADED)
    return "no" if state == UNLOADED else state


def _as_json(config: RouterConfig, models: list[ModelOnDisk], partial: list[PartialPull],
             states: dict[str, str] | None) -> dict[str, Any]:
    return {
        "models_dir": str(config.models_dir),
        "service": service_url(config) if states is not None else None,
        "models": [{"name": m.name, "path": str(m.path), "size_bytes": m.size_bytes, "kind": m.kind,
                    "quantization": m.quantization, "source": m.source,
                    "loaded": None if states is None else states.get(m.name, UNLOADED) != UNLOADED,
                    "state": None if states is None else states.get(m.name, UNLOADED)} for m in models],
        "unfinished_pulls": [{"name": p.name, "path": str(p.path), "size_bytes": p.size_bytes} for p in partial],
    }
