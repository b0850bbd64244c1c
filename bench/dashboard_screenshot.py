"""The README's dashboard picture: the real service on the default model with 8 streaming
clients (agents sharing one long system prompt), a worker restart halfway so the second
half's prompts come back from the SSD, and a screenshot of GET /admin taken by Debian's
chromium (Playwright, never a downloaded browser) while all 8 decode.

    .venv/bin/python bench/dashboard_screenshot.py [--out docs/dashboard.png] [--metrics FILE]

Writes the PNG, and with --metrics an excerpt of GET /metrics taken at the same moment.
Not a benchmark (run_all.py skips it); progress on stderr.
"""

from __future__ import annotations

import argparse
import re
import sys
import threading
import time
from pathlib import Path

import httpx
from openai import OpenAI

from common import REPO, log, mlxd_server

CLIENTS = 8
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
AGENTS = ["claude-cli/2.1.197 (external, cli)", "OpenAI/Python 1.99.1", "opencode/0.15.3", "aider/0.86.1",
          "Cline/3.32.0", "continue/1.2.4", "codex_cli_rs/0.46.0", "langchain-openai/0.3.33"]
SYSTEM = ("You are a coding agent working in a Python repository. " +
          " ".join(f"Rule {i}: keep module {i} importable, typed and tested; never break its public API."
                   for i in range(45)))
QUESTIONS = ["Explain what a prefix cache is.", "Write a haiku about batching.", "List three uses of a queue.",
             "What does a tokenizer do?", "Describe a KV cache in one paragraph.", "Why are small models fast?",
             "Explain continuous batching.", "What is an SSD good for?"]
# the lines of /metrics worth showing in the README's excerpt
EXCERPT = re.compile(r"^(# (HELP|TYPE) )?mlxd_(requests_total|prompt_tokens_total|generated_tokens_total|"
                     r"time_to_first_token_seconds_(count|sum)|request_duration_seconds_(count|sum)|"
                     r"cold_tier_restore_seconds_(count|sum)|running_sequences|queued_sequences|hot_tier_(bytes|blocks|"
                     r"hits_total|misses_total)|cold_tier_(bytes|blocks|hits_total|writes_total)|"
                     r"write_behind_queue_blocks|prompt_cache_hit_ratio|worker_restarts_total|model_loads_total|"
                     r"process_resident_memory_bytes|memory_(budget|used)_bytes)\b")


def client_loop(base_url: str, model: str, index: int, running: threading.Event, stop: threading.Event) -> None:
    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=5,
                    default_headers={"User-Agent": AGENTS[index % len(AGENTS)]})
    turn = 0
    while not stop.is_set():
        running.wait()
        if stop.is_set():
            return
        messages = [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"{QUESTIONS[(index + turn) % len(QUESTIONS)]} (turn {turn})"}]
        try:
            for _ in client.chat.completions.create(model=model, messages=messages, max_tokens=160, temperature=0.7,
                                                    stream=True, extra_body={"cache_salt": f"agent-{index}"}):
                pass
        except Exception as exc:  # noqa: BLE001  (a restart in between: the next turn goes on)
            log("client %d: %s", index, exc)
        turn += 1


def screenshot(url: str, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 940}, device_scale_factor=1)
        page.goto(url)
        page.wait_for_function("document.querySelectorAll('#requests tbody tr[data-request]').length >= 6",
                               timeout=30_000)
        page.wait_for_timeout(2500)  # one more poll: the rows' tok/s are filled
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out), full_page=True)
        browser.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "dashboard.png")
    parser.add_argument("--metrics", type=Path, default=None, help="write an excerpt of /metrics here")
    parser.add_argument("--warm-s", type=float, default=40.0, help="seconds of traffic before the restart")
    parser.add_argument("--after-s", type=float, default=25.0, help="seconds of traffic after it, then the picture")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from models.provision import provision_default_model

    model_dir = provision_default_model(REPO / ".cache" / "test-home")
    with mlxd_server(model_dir, name="dashboard") as server:
        model = httpx.get(f"{server.base_url}/v1/models").json()["data"][0]["id"]
        running, stop = threading.Event(), threading.Event()
        threads = [threading.Thread(target=client_loop, args=(server.base_url, model, i, running, stop), daemon=True)
                   for i in range(CLIENTS)]
        for thread in threads:
            thread.start()
        running.set()
        log("%d clients streaming for %.0f s", CLIENTS, args.warm_s)
        time.sleep(args.warm_s)
        running.clear()  # the turns in flight finish; then the worker restarts and comes back from the SSD
        while httpx.get(f"{server.base_url}/admin/status").json()["requests"]:
            time.sleep(0.2)
        log("restarting the worker: the next turns' prefixes come back from the SSD")
        httpx.post(f"{server.base_url}/admin/workers/{model}/restart", timeout=300).raise_for_status()
        running.set()
        time.sleep(args.after_s)
        if args.metrics is not None:
            text = httpx.get(f"{server.base_url}/metrics").text
            args.metrics.write_text("\n".join(line for line in text.splitlines() if EXCERPT.match(line)) + "\n")
            log("metrics excerpt: %s", args.metrics)
        screenshot(f"{server.base_url}/admin", args.out)
        log("screenshot: %s", args.out)
        stop.set()
        running.set()
        for thread in threads:
            thread.join(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
