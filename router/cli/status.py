"""`mlxd status`: the running service's `/admin/status` as a table for people, or passed
through as JSON (`--json`) for scripts; `--watch` redraws it every `--interval` seconds
until Ctrl-C. Its first lines are the dashboard's top panel (router/dashboard): version
and uptime, memory against the budget, requests served and in flight, tokens per second
now and as a sparkline of the last minutes, and the prompt cache's recent hit rates.

The service is found where the configuration says it listens (the same `--home`,
`--config`, `--host`, `--port` as `serve`), with its API key when it has one.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from router.api_keys import client_key
from router.cli.service_file import service_url
from router.cli.settings_flags import CLIENT_SETTINGS, add_setting_flags, with_settings
from router.cli.tables import duration, percent, rate, size, table
from router.config import RouterConfig
from router.config_file import LoadedConfig

TIMEOUT_S = 10.0


def add_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "status",
        help="show the running service: models, memory, cache tiers, requests",
        description="Read the running service's /admin/status (found by the same --home/--config/--host/--port "
                    "as `mlxd serve`, with its API key) and print it as a table, or as JSON with --json. "
                    "--watch redraws it every --interval seconds (what the dashboard at /admin shows on top, "
                    "then the tables) until Ctrl-C.",
    )
    parser.add_argument("--json", dest="as_json", action="store_true", help="print /admin/status's JSON as is")
    parser.add_argument("--watch", "-w", action="store_true", help="refresh until Ctrl-C")
    parser.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                        help="with --watch: seconds between refreshes (default 2)")
    parser.add_argument("--count", type=int, default=0, metavar="N",
                        help="with --watch: stop after N refreshes (default: until Ctrl-C)")
    add_setting_flags(parser, only=CLIENT_SETTINGS)
    parser.set_defaults(run=with_settings("status", run))


def run(loaded: LoadedConfig, args: argparse.Namespace) -> int:
    if args.watch:
        return watch_command(loaded.config, args.interval, args.count, args.as_json)
    return status_command(loaded.config, args.as_json)


def fetch_status(config: RouterConfig) -> dict[str, Any]:
    """GET /admin/status; raises OSError (nothing listening) or urllib's HTTPError."""
    request = urllib.request.Request(f"{service_url(config)}/admin/status")
    key = client_key(config)
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        return json.loads(response.read())


SPARK_BLOCKS = "▁▂▃▄▅▆▇█"
SPARK_ASCII = "_.-:=+*#"
SPARK_WIDTH = 60


def sparkline(values: list[float], width: int = SPARK_WIDTH, blocks: str = SPARK_BLOCKS) -> str:
    """`values` (oldest first) as one line of at most `width` characters, each the mean of
    its share of the values, scaled to the largest."""
    if not values:
        return ""
    step = max(1, -(-len(values) // width))
    means = [sum(chunk) / len(chunk) for chunk in (values[i:i + step] for i in range(0, len(values), step))]
    top = max(means)
    if top <= 0:
        return blocks[0] * len(means)
    return "".join(blocks[min(len(blocks) - 1, int(v / top * (len(blocks) - 1) + 0.5))] for v in means)


def _can_print(text: str) -> bool:
    try:
        text.encode(sys.stdout.encoding or "ascii")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def meter(fraction: float, width: int = 20) -> str:
    filled = max(0, min(width, round(fraction * width)))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def format_top(status: dict[str, Any], url: str) -> list[str]:
    """The dashboard's top panel as lines: who and since when, memory, traffic, throughput."""
    memory = status.get("memory") or {}
    starting = " (starting: loading its models)" if status.get("starting") else ""
    budget = memory.get("budget_bytes") or 0
    used = memory.get("used_bytes") or 0
    lines = [f"mlxd {status.get('version', '?')} at {url}, up {duration(status.get('uptime_s'))}{starting}",
             f"memory: {size(memory.get('used_bytes'))} used by models of a {size(memory.get('budget_bytes'))} "
             f"budget {meter(used / budget if budget else 0.0)}; machine {size(memory.get('available_bytes'))} "
             f"free of {size(memory.get('total_bytes'))}"]
    totals = status.get("totals")
    if totals is None:  # a service older than the dashboard
        return lines
    live = [r for r in status.get("requests") or [] if r.get("route")]
    queued = sum(1 for r in live if r.get("state") == "queued")
    points = (status.get("history") or {}).get("points") or []
    last = points[-1] if points else {}
    prompt = totals.get("prompt_tokens") or {}
    hits = (f"{percent(last.get('hot_hit_rate'))} hot, {percent(last.get('cold_hit_rate'))} cold"
            if last.get("hot_hit_rate") is not None else "-")
    lines.append(f"requests: {totals.get('requests', 0)} served, {len(live)} in flight ({queued} queued); "
                 f"tokens: {totals.get('generated_tokens', 0)} generated, prompt {prompt.get('hot', 0)} hot / "
                 f"{prompt.get('cold', 0)} cold / {prompt.get('computed', 0)} computed; "
                 f"prompt cache (last {(status.get('history') or {}).get('hit_rate_window_s', 30):.0f} s): {hits}")
    rates = [float(p.get("generated_tok_s") or 0.0) for p in points]
    if rates:
        blocks = SPARK_BLOCKS if _can_print(SPARK_BLOCKS) else SPARK_ASCII
        lines.append(f"generated tok/s: {rates[-1]:.1f} now, peak {max(rates):.1f}; last "
                     f"{duration(points[-1]['t'] - points[0]['t'])}: {sparkline(rates, blocks=blocks)}")
    return lines


def format_status(status: dict[str, Any], url: str) -> str:
    """The status object (README "Admin status") as the lines a person reads."""
    lines = [*format_top(status, url), ""]
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
        rows = [["REQUEST", "MODEL", "STATE", "PROMPT", "CACHED", "TOKENS", "TOK/S", "AGE", "CLIENT"]]
        rows += [[str(r.get("id")), str(r.get("model")), str(r.get("state")),
                  "-" if r.get("prompt_tokens") is None else str(r.get("prompt_tokens")),
                  str(r.get("cached_tokens") or 0), str(r.get("generated_tokens", r.get("tokens", 0))),
                  rate(r.get("tok_s")), duration(r.get("age_s")), str(r.get("user_agent") or "-")[:40]]
                 for r in requests]
        lines += table(rows)
    return "\n".join(lines) + "\n"


def _refused(url: str, code: int, reason: str) -> str:
    hint = ("set the admin key (--admin-key or $MLXD_ADMIN_KEY) or the API key (--api-key or $MLXD_API_KEY)"
            if code in (401, 403) else reason)
    return f"mlxd status: {url}/admin/status answered {code} ({hint})"


def watch_command(config: RouterConfig, interval_s: float, count: int = 0, as_json: bool = False) -> int:
    """`mlxd status --watch`: the status redrawn every `interval_s` (a terminal is cleared
    first; a pipe gets one frame after another) until Ctrl-C, or `count` frames. A service
    that is not answering (restarting) is said so in the frame and asked again; a refused
    key ends it (exit 1), since asking again cannot help."""
    interval_s = max(0.1, interval_s)
    clear = sys.stdout.isatty()
    frames = 0
    try:
        while True:
            url = service_url(config)
            try:
                status = fetch_status(config)
                text = json.dumps(status) + "\n" if as_json else format_status(status, url)
            except urllib.error.HTTPError as exc:
                if exc.code in (401, 403):
                    print(_refused(url, exc.code, str(exc.reason)), file=sys.stderr)
                    return 1
                text = f"{_refused(url, exc.code, str(exc.reason))}; asking again\n"
            except (OSError, ValueError) as exc:
                text = f"mlxd status: no mlxd answering at {url} ({exc}); asking again\n"
            if clear:
                sys.stdout.write("\x1b[H\x1b[2J")
            elif frames and not as_json:
                sys.stdout.write("\n")
            sys.stdout.write(text)
            if not as_json:
                sys.stdout.write(f"-- {time.strftime('%H:%M:%S')}, every {interval_s:g} s; Ctrl-C to stop\n")
            sys.stdout.flush()
            frames += 1
            if count and frames >= count:
                return 0
            time.sleep(interval_s)
    except KeyboardInterrupt:
        if clear:
            sys.stdout.write("\n")
        return 0


def status_command(config: RouterConfig, as_json: bool) -> int:
    url = service_url(config)
    try:
        status = fetch_status(config)
    except urllib.error.HTTPError as exc:
        print(_refused(url, exc.code, str(exc.reason)), file=sys.stderr)
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
