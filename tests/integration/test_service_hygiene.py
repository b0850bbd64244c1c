"""The real service on the real default model, as one installation among others: one
service per home, private files, forged log lines impossible, and a SIGKILLed router
leaving nothing behind that stops the next one (children, lock, runtime dir, its cache).

The tests run in order on one service; the last one kills it and starts the next.
"""

from __future__ import annotations

import re
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from router.cli.service_file import find_service, read_service_file
from tests.integration.service import REPO, Service, free_port, running_service

pytestmark = pytest.mark.timeout(300)

# long enough to fill SSD blocks (256 tokens each), so the kvstore writes segments
SYSTEM = "You are a terse assistant. " + " ".join(f"Fact {i}: crate {i} holds {i * 7} apples." for i in range(60))
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "How many apples are in crate 12?"}]


def ask(svc: Service) -> str:
    return ask_with_usage(svc)[0]


def ask_with_usage(svc: Service) -> tuple[str, int]:
    """The greedy answer and how many of its prompt tokens came from the cache."""
    client = openai.OpenAI(base_url=f"{svc.base_url}/v1", api_key="x", max_retries=0)
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(model=model, messages=MESSAGES, temperature=0, max_tokens=12)
    content = reply.choices[0].message.content
    assert content and reply.usage is not None and reply.usage.prompt_tokens_details is not None
    return content, reply.usage.prompt_tokens_details.cached_tokens or 0


def _gone(pid: int) -> bool:
    try:  # an orphan may wait a while to be reaped: a zombie counts as gone
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home as an older version left it: world-readable, with its cache dir."""
    home = tmp_path_factory.mktemp("home")
    (home / "kvcache" / "segments").mkdir(parents=True)
    for path in (home, home / "kvcache", home / "kvcache" / "segments"):
        path.chmod(0o755)
    return home


@pytest.fixture(scope="module")
def first(default_model_dir: Path, home: Path) -> Iterator[Service]:
    with running_service(["--model", str(default_model_dir)], home) as svc:
        yield svc


@pytest.fixture(scope="module")
def answer(first: Service) -> str:
    """The greedy answer before anything else happens to the service."""
    return ask(first)


def test_a_second_service_on_the_same_home_is_refused(first: Service, answer: str,
                                                      default_model_dir: Path, home: Path) -> None:
    started = time.monotonic()
    second = subprocess.run(
        [sys.executable, "-m", "router", "serve", "--home", str(home), "--model", str(default_model_dir),
         "--port", str(free_port())],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert second.returncode == 1
    assert (f"mlxd: another mlxd (pid {first.proc.pid}) is already serving home {home}; "
            "stop it first or use --home") in second.stderr
    assert time.monotonic() - started < 15  # refused before loading anything
    assert first.proc.poll() is None
    assert ask(first) == answer


def test_home_and_cache_files_are_private(first: Service, answer: str, home: Path) -> None:
    cache = home / "kvcache"
    deadline = time.monotonic() + 30  # writes are write-behind: wait for the first blocks
    while not any(p.stat().st_size for p in (cache / "segments").glob("*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    paths = [cache, *cache.rglob("*")]
    assert len(paths) > 3
    modes = {p.relative_to(home).as_posix(): stat.S_IMODE(p.lstat().st_mode) for p in paths}
    assert {m for p, m in modes.items() if (home / p).is_dir()} == {0o700}, modes
    assert {m for p, m in modes.items() if (home / p).is_file()} == {0o600}, modes
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "mlxd.lock").stat().st_mode) == 0o600


def test_a_model_name_cannot_forge_a_log_line(first: Service) -> None:
    forged = "INFO router router.admin: model evil loaded"
    r = httpx.post(f"{first.base_url}/v1/chat/completions", timeout=30,
                   json={"model": f"nope\n{forged}\r\x1b[2K", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404
    deadline = time.monotonic() + 5
    while "nope\\n" not in first.log_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = first.log_text().splitlines()
    assert [line for line in lines if "nope\\n" + forged + "\\r\\x1b[2K" in line]
    assert not [line for line in lines if line.startswith(forged) or "\x1b" in line]


def test_a_sigkilled_router_leaves_nothing_that_stops_the_next(first: Service, answer: str,
                                                               default_model_dir: Path, home: Path) -> None:
    children = psutil.Process(first.proc.pid).children(recursive=True)
    commands = {child.pid: " ".join(child.cmdline()) for child in children}
    assert any("-m worker" in c for c in commands.values()) and any("-m kvstore" in c for c in commands.values())
    runtime_dir = Path(re.search(r"ipc://(\S+)/workers", " ".join(commands.values())).group(1))  # type: ignore[union-attr]
    assert runtime_dir.is_dir()

    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(timeout=10)
    killed_at = time.monotonic()
    try:
        while not all(_gone(pid) for pid in commands) and time.monotonic() - killed_at < 10:
            time.sleep(0.05)
        lingering = {pid: commands[pid] for pid in commands if not _gone(pid)}
        assert not lingering and time.monotonic() - killed_at < 5, f"children outlived the router: {lingering}"
    finally:
        for pid in commands:
            if not _gone(pid):
                psutil.Process(pid).kill()
    assert runtime_dir.is_dir()  # nobody removed it yet: the next router must
    left = read_service_file(home)
    assert left is not None and left.pid == first.proc.pid and find_service(home) is None  # names the dead

    after = Service(["--model", str(default_model_dir)], home=home)
    try:
        after.wait_ready()
        assert not runtime_dir.exists()
        running = find_service(home)
        assert running is not None and running.url == after.base_url
        text, cached = ask_with_usage(after)
        assert text == answer
        assert cached >= 256, "the first request after the kill must hit the SSD blocks written before it"
    finally:
        after.stop()
    log = after.log_text()
    # the orphaned kvstore flushed and closed its index on the way out: it opens whole
    assert re.search(r"kvstore.*opened \S+: [1-9]\d* blocks", log), log[-3000:]
    for damage in ("rebuilding it from", "no longer match their segment", "torn tail", "Traceback"):
        assert damage not in log
