"""`mlxd cache stats|clear [--model NAME]`: the running service's prefix cache from the
shell, through its `/admin/cache` routes. The service is found as `mlxd status` finds it
(the same `--home`, `--config`, `--host`, `--port`, with its key); a clear goes through the
service, which has its workers and kvstore drop the blocks, never by deleting its files."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from router.api_keys import client_key
from router.cli.service_file import service_url
from router.cli.settings_flags import CLIENT_SETTINGS, add_setting_flags, with_settings
from router.cli.tables import percent, size, table
from router.config import RouterConfig
from router.config_file import LoadedConfig

ACTIONS = ("stats", "clear")
# a clear waits for each worker's next step and for the kvstore's queued writes
CLEAR_TIMEOUT_S = 90.0
STATS_TIMEOUT_S = 10.0


def add_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "cache",
        help="show or clear the running service's prefix cache",
        description="stats: per model the hot tier (in each worker) and the cold tier (the kvstore on SSD), "
                    "from the running service's /admin/cache. clear: has the workers and the kvstore drop "
                    "the blocks (of --model, or of every model) and prints what was removed; requests "
                    "running meanwhile finish unchanged. The service is found as `mlxd status` finds it.",
    )
    parser.add_argument("cache_action", choices=ACTIONS, metavar="stats|clear", help="what to do")
    parser.add_argument("--model", dest="cache_model", metavar="NAME", default=None,
                        help="only this model (a name, profile or alias; default: every model)")
    parser.add_argument("--json", dest="as_json", action="store_true",
                        help="print the service's JSON answer as is")
    add_setting_flags(parser, only=CLIENT_SETTINGS)
    parser.set_defaults(run=with_settings("cache", run))


def run(loaded: LoadedConfig, args: argparse.Namespace) -> int:
    return cache_command(loaded.config, args.cache_action, args.cache_model, args.as_json)


class ServiceError(Exception):
    """The service could not be asked, or refused: one line that says what to do."""


def call(config: RouterConfig, method: str, path: str, body: dict[str, Any] | None = None,
         timeout_s: float = STATS_TIMEOUT_S) -> dict[str, Any]:
    """One admin request to the running service; raises ServiceError."""
    url = f"{service_url(config)}{path}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    key = client_key(config)
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise ServiceError(f"{url} answered {exc.code}: {_error_message(exc)}") from None
    except (OSError, ValueError) as exc:
        raise ServiceError(f"no mlxd answering at {service_url(config)} ({exc}); is it running? "
                           "(`mlxd service status`, or the --home/--port it was started with)") from None


def _error_message(exc: urllib.error.HTTPError) -> str:
    if exc.code in (401, 403):
        return ("set the admin key (--admin-key or $MLXD_ADMIN_KEY) or the API key "
                "(--api-key or $MLXD_API_KEY)")
    try:
        return str(json.loads(exc.read())["error"]["message"])
    except (OSError, ValueError, KeyError, TypeError):
        return str(exc.reason)


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def format_stats(stats: dict[str, Any], url: str) -> str:
    """GET /admin/cache as the lines a person reads: one row per model, then the store."""
    rows = [["MODEL", "STATE", "HOT BLOCKS", "HOT SIZE", "HOT HITS", "HOT HIT", "COLD BLOCKS", "COLD SIZE",
             "COLD HITS", "COLD HIT"]]
    for model in stats.get("models") or []:
        hot, cold = model.get("hot_tier"), model.get("cold_tier")
        rows.append([str(model.get("id")), str(model.get("state")),
                     *([_count(hot.get("blocks")), f"{size(hot.get('bytes'))} / {size(hot.get('budget_bytes'))}",
                        _count(hot.get("hits")), percent(hot.get("hit_rate"))] if hot else ["-"] * 4),
                     *([_count(cold.get("blocks")), size(cold.get("bytes")), _count(cold.get("hits")),
                        percent(cold.get("hit_rate"))] if cold else ["-"] * 4)])
    lines = [f"prefix cache of mlxd at {url}", "", *table(rows), ""]
    cold = stats.get("cold_tier")
    if cold is None:
        lines.append("cold tier: off")
    else:
        lines.append(f"cold tier ({cold.get('state')}): {_count(cold.get('blocks'))} blocks, "
                     f"{size(cold.get('bytes'))} of {size(cold.get('max_bytes'))}, {_count(cold.get('hits'))} hits, "
                     f"hit {percent(cold.get('hit_rate'))}")
        if cold.get("snapshots"):
            lines.append(f"snapshots: {cold['snapshots']}, pinning {_count(cold.get('pinned_blocks'))} blocks "
                         f"({size(cold.get('pinned_bytes'))}) in the cold tier (GET /admin/cache/snapshots)")
    return "\n".join(lines) + "\n"


def format_cleared(answer: dict[str, Any]) -> str:
    """POST /admin/cache/clear's answer: what each tier removed, and the service's notes."""
    lines = []
    for model in answer.get("models") or []:
        hot = model.get("hot_tier")
        if hot is None:
            lines.append(f"{model.get('id')}: not loaded, no hot tier")
        else:
            lines.append(f"{model.get('id')}: removed {hot.get('blocks', 0)} hot blocks ({size(hot.get('bytes'))})"
                         + (f", dropped {hot['dropped_writes']} pending SSD writes" if hot.get("dropped_writes") else ""))
    cold = answer.get("cold_tier")
    if cold is not None:
        scope = f"model {cold['namespace']}" if cold.get("namespace") else "every model"
        lines.append(f"cold tier: removed {cold.get('blocks', 0)} blocks ({scope})")
    lines += [f"note: {note}" for note in answer.get("notes") or []]
    return "\n".join(lines) + "\n"


def cache_command(config: RouterConfig, action: str, model: str | None, as_json: bool) -> int:
    """`mlxd cache ACTION`: 0 when the service answered, 1 (one line on stderr) otherwise."""
    try:
        if action == "clear":
            answer = call(config, "POST", "/admin/cache/clear", {"model": model} if model else {},
                          timeout_s=CLEAR_TIMEOUT_S)
        else:
            query = f"?{urllib.parse.urlencode({'model': model})}" if model else ""
            answer = call(config, "GET", f"/admin/cache{query}")
    except ServiceError as exc:
        print(f"mlxd cache {action}: {exc}", file=sys.stderr)
        return 1
    if as_json:
        sys.stdout.write(json.dumps(answer, indent=2) + "\n")
    elif action == "clear":
        sys.stdout.write(format_cleared(answer))
    else:
        sys.stdout.write(format_stats(answer, service_url(config)))
    return 0
