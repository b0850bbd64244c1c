"""Where a real agent session's prompts stop sharing a prefix: record its request bodies,
then render them to token ids as mlxd does and diff each with the one before.

  python bench/prefix_breaks.py proxy --upstream http://127.0.0.1:8000 --port 8100 --out DIR
      a recording reverse proxy: point the client's base URL at it; each POST body goes to
      DIR/NNN.json (answers stream through untouched)
  python bench/prefix_breaks.py report DIR --model-dir MODEL [--log SERVER_LOG] [--out JSON]
      per request: its prompt tokens, how many it shares with the previous request's prompt
      (`common_with_previous`), the text on both sides of the first difference when it
      breaks inside the previous prompt, and, with the service's log, the cached tokens the
      router logged (`after N+M tokens (K cached)`, in order). The median cached fraction
      of the requests after the first is the figure issue 30 asks for.

  python bench/prefix_breaks.py shared A.json B.json --model-dir MODEL [--block-tokens 256]
      two recorded requests (e.g. one agent's first request in two projects): the tokens
      their prompts share under each prompt layout (`stable_first`, `template`), and the
      whole blocks of it, which is what the prefix cache serves B after A

A break inside the previous prompt is a cache-buster: something the client changed in
history it already sent (or mlxd renders differently). A break after it is the new turn,
or the previous answer rendered unlike the tokens the model generated.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LOGGED = re.compile(r"after (\d+)\+(\d+) tokens \((\d+) cached\)")


def run_proxy(upstream: str, port: int, out: Path) -> None:
    import httpx
    import uvicorn
    from starlette.applications import Starlette
    from starlette.background import BackgroundTask
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    out.mkdir(parents=True, exist_ok=True)
    numbers = itertools.count(len(list(out.glob("*.json"))) + 1)
    client = httpx.AsyncClient(timeout=None)

    async def forward(request: Request) -> StreamingResponse:
        body = await request.body()
        if request.method == "POST" and body:
            record = {"path": request.url.path, "time": time.time(), "body": json.loads(body)}
            (out / f"{next(numbers):03d}.json").write_text(json.dumps(record))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        url = upstream + request.url.path + (f"?{request.url.query}" if request.url.query else "")
        answer = await client.send(client.build_request(request.method, url, headers=headers, content=body),
                                   stream=True)
        kept = {k: v for k, v in answer.headers.items()
                if k.lower() not in ("content-length", "transfer-encoding", "content-encoding")}
        return StreamingResponse(answer.aiter_raw(), status_code=answer.status_code, headers=kept,
                                 background=BackgroundTask(answer.aclose))

    app = Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST", "HEAD", "PUT", "DELETE"])])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def render(record: dict[str, Any], tokenizer: Any, layout: str | None = None) -> list[int] | None:
    """The prompt token ids mlxd renders for one recorded body (None: not a chat route)."""
    from router.api import anthropic_messages, openai_chat, openai_responses
    from router.api.response_store import ResponseStore
    from worker.prompts import render_chat

    path, body = record["path"], record["body"]
    if path.endswith("/messages"):
        parsed = anthropic_messages.parse(body)
    elif path.endswith("/responses"):
        parsed = openai_responses.parse(body, store=ResponseStore())
    elif path.endswith("/chat/completions"):
        parsed = openai_chat.parse(body)
    else:
        return None
    add = parsed.add
    if layout is None:
        return render_chat(tokenizer, add.messages, add.tools, add.continue_final_message)
    return render_chat(tokenizer, add.messages, add.tools, add.continue_final_message, layout=layout)


def shared(first: Path, second: Path, model_dir: Path, block_tokens: int) -> dict[str, Any]:
    """What the prefix cache can serve `second` once `first` was computed, per layout."""
    from mlx_lm.utils import load_tokenizer

    from protocol.settings import PROMPT_LAYOUTS

    tokenizer = load_tokenizer(model_dir)
    records = [json.loads(path.read_text()) for path in (first, second)]
    out: dict[str, Any] = {"first": str(first), "second": str(second), "model": model_dir.name,
                           "block_tokens": block_tokens, "layouts": {}}
    for layout in PROMPT_LAYOUTS:
        a, b = (render(record, tokenizer, layout) for record in records)
        assert a is not None and b is not None, "not a chat route"
        common = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        whole = min(common, len(b) - 1) // block_tokens * block_tokens  # a hit leaves one token to prefill
        out["layouts"][layout] = {
            "prompt_tokens": len(b), "shared_tokens": common, "cacheable_tokens": whole,
            "cacheable_fraction": round(whole / len(b), 4),
            "breaks_at": tokenizer.decode(b[max(0, common - 12) : common + 12]),
        }
    return out


def report(captured: Path, model_dir: Path, log: Path | None) -> dict[str, Any]:
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    logged = [tuple(map(int, m.groups())) for m in LOGGED.finditer(log.read_text())] if log else []
    rows: list[dict[str, Any]] = []
    previous: list[int] | None = None
    for path in sorted(captured.glob("*.json")):
        ids = render(json.loads(path.read_text()), tokenizer)
        if ids is None:
            continue
        row: dict[str, Any] = {"request": path.stem, "prompt_tokens": len(ids)}
        if previous is not None:
            common = next((i for i, (a, b) in enumerate(zip(previous, ids)) if a != b), min(len(previous), len(ids)))
            row["common_with_previous"] = common
            if common < len(previous):
                row["previous_at_break"] = tokenizer.decode(previous[max(0, common - 20):common]) + " ⟦ " + \
                    tokenizer.decode(previous[common:common + 30])
                row["this_at_break"] = tokenizer.decode(ids[max(0, common - 20):common]) + " ⟦ " + \
                    tokenizer.decode(ids[common:common + 30])
        previous = ids
        rows.append(row)
    for row, (prompt, completion, cached) in zip(rows, logged):
        row.update(logged_prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached,
                   cached_fraction=round(cached / prompt, 4))
    later = [row["cached_fraction"] for row in rows[1:] if "cached_fraction" in row]
    return {"requests": rows, "median_cached_fraction_after_first": statistics.median(later) if later else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    proxy = commands.add_parser("proxy")
    proxy.add_argument("--upstream", required=True)
    proxy.add_argument("--port", type=int, required=True)
    proxy.add_argument("--out", type=Path, required=True)
    rep = commands.add_parser("report")
    rep.add_argument("captured", type=Path)
    rep.add_argument("--model-dir", type=Path, required=True)
    rep.add_argument("--log", type=Path)
    rep.add_argument("--out", type=Path)
    both = commands.add_parser("shared")
    both.add_argument("first", type=Path)
    both.add_argument("second", type=Path)
    both.add_argument("--model-dir", type=Path, required=True)
    both.add_argument("--block-tokens", type=int, default=256)
    both.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.command == "proxy":
        run_proxy(args.upstream.rstrip("/"), args.port, args.out)
        return
    if args.command == "shared":
        result = shared(args.first, args.second, args.model_dir, args.block_tokens)
    else:
        result = report(args.captured, args.model_dir, args.log)
    text = json.dumps(result, indent=1, ensure_ascii=False)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
