"""The real service with named API keys, an admin key, a key file and a config file it
re-reads on SIGHUP and POST /admin/reload; and its start, where /health says `starting`
while the model loads and a request sent meanwhile waits and is answered."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.integration.service import REPO, Service

pytestmark = pytest.mark.timeout(300)
ALICE, BOB, CAROL, ADMIN = "sk-alice-1", "sk-bob-2", "sk-carol-3", "sk-admin-4"
QUESTION = [{"role": "user", "content": "Name three colours."}]


def _config(model: str, ttl_s: int, aliases: list[str]) -> str:
    return (f'admin_key = "{ADMIN}"\n\n[api_keys]\nalice = "{ALICE}"\n\n'
            f'[models."{model}"]\nttl_s = {ttl_s}\naliases = {aliases!r}\n').replace("'", '"')


class Started:
    """The service, and what was seen while it started."""

    def __init__(self, service: Service, model: str, first_health: dict, early: dict) -> None:
        self.service, self.model, self.first_health, self.early = service, model, first_health, early


@pytest.fixture(scope="module")
def started(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Started]:
    home = tmp_path_factory.mktemp("home")
    model = default_model_dir.name
    (home / "keys.txt").write_text(f"# name key\nbob {BOB}\n")
    (home / "config.toml").write_text(_config(model, 600, ["smol"]))
    (home / "models").mkdir()
    (home / "models" / model).symlink_to(default_model_dir)  # so `mlxd models list` / `rm` see it
    service = Service(["--model", str(default_model_dir), "--api-key-file", str(home / "keys.txt")], home=home)
    early: dict = {}
    first_health: dict = {}
    try:
        deadline = time.monotonic() + 60
        while not first_health:
            assert time.monotonic() < deadline and service.proc.poll() is None, service.log_text()[-3000:]
            try:
                answer = httpx.get(f"{service.base_url}/health", timeout=2)
                first_health.update(answer.json(), code=answer.status_code)
            except httpx.TransportError:
                time.sleep(0.02)

        def ask_early() -> None:
            answer = httpx.post(f"{service.base_url}/v1/chat/completions", timeout=120,
                                headers={"Authorization": f"Bearer {ALICE}"},
                                json={"model": "smol", "messages": QUESTION, "max_tokens": 8, "temperature": 0})
            early.update(code=answer.status_code, body=answer.json())

        asker = threading.Thread(target=ask_early)
        asker.start()
        service.wait_ready()
        asker.join(timeout=120)
        yield Started(service, model, first_health, early)
    finally:
        service.stop()


def test_health_says_starting_while_loading_and_early_requests_wait(started: Started) -> None:
    assert started.first_health["code"] == 503 and started.first_health["status"] == "starting"
    assert started.early["code"] == 200, started.early
    assert started.early["body"]["choices"][0]["message"]["content"]
    health = httpx.get(f"{started.service.base_url}/health", timeout=5)
    assert health.status_code == 200 and health.json()["status"] == "ok"


def test_keys_from_config_and_key_file_named_in_logs_and_status(started: Started) -> None:
    url = f"{started.service.base_url}/v1"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url, api_key="sk-wrong", max_retries=0).models.list()
    answer = openai.OpenAI(base_url=url, api_key=BOB, max_retries=0).chat.completions.create(
        model="smol", messages=QUESTION, max_tokens=4, temperature=0)
    assert answer.choices[0].message.content
    claude = anthropic.Anthropic(base_url=started.service.base_url, api_key=ALICE, max_retries=0)
    assert claude.messages.create(model="smol", max_tokens=4, messages=QUESTION).content
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=started.service.base_url, api_key="nope", max_retries=0).messages.create(
            model="smol", max_tokens=4, messages=QUESTION)
    admin_url = f"{started.service.base_url}/admin/status"
    denied = httpx.get(admin_url, headers={"Authorization": f"Bearer {ALICE}"}, timeout=10)
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "insufficient_permissions"
    assert httpx.get(admin_url, timeout=10).status_code == 401
    status = httpx.get(admin_url, headers={"x-api-key": ADMIN}, timeout=10)
    assert status.status_code == 200
    keys = {entry["name"]: entry for entry in status.json()["keys"]}
    assert set(keys) == {"alice", "bob", "admin"} and keys["admin"]["admin"] and keys["bob"]["requests"] >= 1
    for secret in (ALICE, BOB, ADMIN):
        assert secret not in status.text and secret not in started.service.log_text()
    assert "(key bob)" in started.service.log_text()
    assert httpx.get(f"{started.service.base_url}/health", timeout=5).status_code == 200  # open


def test_sighup_applies_ttl_alias_and_keys_with_a_stream_in_flight(started: Started) -> None:
    service, home = started.service, started.service.home
    client = openai.OpenAI(base_url=f"{service.base_url}/v1", api_key=ALICE, max_retries=0)
    worker_pid = httpx.get(f"{service.base_url}/health", headers={"x-api-key": ADMIN}).json()[
        "workers"][started.model]["pid"]
    stream = client.chat.completions.create(model="smol", messages=QUESTION, max_tokens=48, temperature=0,
                                            stream=True)
    first = next(iter(stream))
    (home / "config.toml").write_text(_config(started.model, 900, ["smol", "smol-next"]))
    (home / "keys.txt").write_text(f"bob {BOB}\ncarol {CAROL}\n")
    mark = service.log_mark()
    service.proc.send_signal(signal.SIGHUP)
    line = service.wait_for_log("reloaded", after=mark)
    assert "models." in line and "ttl_s" in line and CAROL not in line
    text = (first.choices[0].delta.content or "") + "".join(
        chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text  # the stream in flight finished
    status = httpx.get(f"{service.base_url}/admin/status", headers={"x-api-key": ADMIN}).json()
    entry = next(m for m in status["models"] if m["id"] == started.model)
    assert entry["ttl_s"] == 900 and entry["pid"] == worker_pid  # not reloaded: same worker
    carol = openai.OpenAI(base_url=f"{service.base_url}/v1", api_key=CAROL, max_retries=0)
    assert carol.chat.completions.create(model="smol-next", messages=QUESTION, max_tokens=4).choices


def test_a_broken_file_is_refused_and_the_service_runs_on(started: Started) -> None:
    service, home = started.service, started.service.home
    good = (home / "config.toml").read_text()
    try:
        (home / "config.toml").write_text(good + "\nport = \n")
        refused = httpx.post(f"{service.base_url}/admin/reload", headers={"x-api-key": ADMIN}, timeout=30)
        assert refused.status_code == 400 and "running one stays" in refused.json()["error"]["message"]
        assert "config.toml" in refused.json()["error"]["message"]
        (home / "config.toml").write_text(good.replace("ttl_s = 900", "ttl_s = -5"))  # parses, fails its check
        mark = service.log_mark()
        service.proc.send_signal(signal.SIGHUP)
        service.wait_for_log("reload refused", after=mark)
        answer = openai.OpenAI(base_url=f"{service.base_url}/v1", api_key=ALICE, max_retries=0)\
            .chat.completions.create(model="smol-next", messages=QUESTION, max_tokens=4)
        assert answer.choices  # the running configuration (its aliases) stayed
    finally:
        (home / "config.toml").write_text(good)
    applied = httpx.post(f"{service.base_url}/admin/reload", headers={"x-api-key": ADMIN}, timeout=30)
    assert applied.status_code == 200 and applied.json()["reloaded"], applied.text
    assert httpx.post(f"{service.base_url}/admin/reload", headers={"x-api-key": ALICE}).status_code == 403


def test_non_loopback_bind_without_a_key_refuses_to_start(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "router", "serve", "--host", "0.0.0.0", "--home", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.returncode == 2 and "--api-key" in done.stderr, done.stderr


def test_shell_commands_find_the_service_through_its_home(started: Started) -> None:
    """No --port given: `mlxd status` and `mlxd wait` read where the home's service listens,
    and `mlxd status` sends the admin key from the home's config file."""
    home = str(started.service.home)
    waited = subprocess.run([sys.executable, "-m", "router", "wait", "--home", home, "--timeout", "30"],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert waited.returncode == 0, waited.stderr
    assert waited.stdout.startswith(f"mlxd ready on {started.service.base_url} ")
    shown = subprocess.run([sys.executable, "-m", "router", "status", "--home", home],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert started.service.base_url in shown.stdout and started.model in shown.stdout
    assert "keys: alice" in shown.stdout and ADMIN not in shown.stdout


def test_models_list_shows_what_is_loaded_and_rm_refuses_it(started: Started) -> None:
    home = str(started.service.home)

    def mlxd(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "router", *args, "--home", home], cwd=REPO,
                              capture_output=True, text=True, timeout=60)

    listed = mlxd("models", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    (entry,) = json.loads(listed.stdout)["models"]
    assert entry["name"] == started.model and entry["loaded"] is True and entry["kind"] == "chat"
    refused = mlxd("rm", started.model, "--yes")
    assert refused.returncode == 1 and "unload it first" in refused.stderr, refused.stderr
    assert (started.service.home / "models" / started.model).exists()
    missing = mlxd("rm", "no-such-model", "--yes")
    assert missing.returncode == 1 and started.model in missing.stderr  # lists what is on disk
