"""`mlxd status`: the running service's `/admin/status` as a table for people, or passed
through as JSON (`--json`) for scripts.

The service is found where the configuration says it listens (the same `--home`,
`--config`, `--host`, `--port` as `serve`), with its API key when it has one.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from typing import Any

from router.api_keys import client_key
from router.config import RouterConfig
from router.service_file import find_service, local_url

TIMEOUT_S = 10.0


def service_url(config: RouterConfig) -> str:
    """Where the service serving `config.home` listens, as its home names it (it may run
    on another port than this shell's configuration says); else the configured address."""
    running = find_service(config.home)
    return running.url if running is not None else local_url(config.host, config.port)


def fetch_status(config: RouterConfig) -> dict[str, Any]:
    """GET /admin/status; raises OSError (nothing listening) or urllib's HTTPError."""
    request = urllib.request.Request(f"{service_url(config)}/admin/status")
    key = client_key(config)
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        return json.loads(response.read())


def size(num_bytes: float | None) -> str:
    if num_bytes is None:
        return "-"
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def rate(value: float | None) -> str:
    return "-" if not value else f"{value:.1f}"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def table(rows: list[list[str]]) -> list[str]:
    """Columns padded to their widest cell; the first row is the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def format_status(status: dict[str, Any], url: str) -> str:
    """The status object (README "Admin status") as the lines a person reads."""
    memory = status.get("memory") or {}
    starting = " (starting: loading its models)" if status.get("starting") else ""
    lines = [f"mlxd {status.get('version', '?')} at {url}, up {duration(status.get('uptime_s'))}{starting}",
             f"memory: {size(memory.get('used_bytes'))} used by models of a {size(memory.get('budget_bytes'))} "
             f"budget; machine {size(memory.get('available_bytes'))} free of {size(memory.get('total_bytes'))}",
             ""]
    rows = [["MODEL", "STATE", "PINNED", "MEMORY", "REQUESTS", "HOT TIER", "HIT", "PROMPT T/S", "DECODE T/S",
             "TTL LEFT"]]
    for model in status.get("models") or []:
        hot = model.get("hot_tier") or {}
        rows.append([
            str(model.get("id")), str(model.get("state")), "yes" if model.get("pinned") else "no",
            size(model.get("rss_bytes") or model.get("estimated_bytes")), str(model.get("requests_in_flight", 0)),
            f"{size(hot.get('bytes'))} / {size(hot.get('budget_bytes'))}" if hot else "-",
            percent(hot.get("hit_rate")) if hot else "-",
            rate(model.get("recent_prompt_tok_s")), rate(model.get("recent_decode_tok_s")),
            duration(model.get("ttl_left_s")),
        ])
    lines += table(rows)
    kvstore = status.get("kvstore")
    lines.append("")
    if kvstore is None:
        lines.append("cold tier: off")
    else:
        lines.append(f"cold tier ({kvstore.get('state')}): {size(kvstore.get('bytes'))} of "
                     f"{size(kvstore.get('max_bytes'))}, {kvstore.get('blocks', 0)} blocks, hit "
                     f"{percent(kvstore.get('hit_rate'))}, write queue {kvstore.get('write_queue_depth', 0)}, "
                     f"dropped writes {kvstore.get('dropped_writes', 0)}")
    keys = status.get("keys") or []
    if keys:
        lines.append("keys: " + ", ".join(f"{k.get('name')}{' (admin)' if k.get('admin') else ''}: "
                                          f"{k.get('requests', 0)} requests" for k in keys))
    requests = status.get("requests") or []
    lines.append("")
    if not requests:
        lines.append("requests: none in flight")
    else:
        rows = [["REQUEST", "MODEL", "STATE", "TOKENS", "AGE", "CLIENT"]]
        rows += [[str(r.get("id")), str(r.get("model")), str(r.get("state")), str(r.get("tokens", 0)),
                  duration(r.get("age_s")), str(r.get("user_agent") or "-")[:40]] for r in requests]
        lines += table(rows)
    return "\n".join(lines) + "\n"


def status_command(config: RouterConfig, as_json: bool) -> int:
    url = service_url(config)
    try:
        status = fetch_status(config)
    except urllib.error.HTTPError as exc:
        print(f"mlxd status: {url}/admin/status answered {exc.code} "
              f"({'set the admin key (--admin-key or $MLXD_ADMIN_KEY) or the API key (--api-key or $MLXD_API_KEY)' if exc.code in (401, 403) else exc.reason})",
              file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"mlxd status: no mlxd answering at {url} ({exc}); is it running? (`mlxd service status`, "
              "or the --home/--port it was started with)", file=sys.stderr)
        return 1
    if as_json:
        sys.stdout.write(json.dumps(status, indent=2) + "\n")
    else:
        sys.stdout.write(format_status(status, url))
    return 0
