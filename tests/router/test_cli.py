"""router.cli (the `mlxd` command): argument parsing, help, refusals with clear errors, model resolution."""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from router import cli, model_files
from router.cli.mlxd import build_parser
from router.cli.serve import listen_socket
from router.cli.settings_flags import config_from_args, given_flags
from router.config import RENAMED_SETTINGS, make_config, setting_fields
from router.config_file import API_KEY_ENV
from router.model_files import ModelNotFound, resolve_model

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No developer's ~/.mlxd/config.toml may leak into what these tests parse."""
    monkeypatch.setenv("MLXD_HOME", str(tmp_path / "mlxd-home"))


def run_mlxd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "router", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("argv", [["--help"], ["serve", "--help"], ["convert", "--help"], ["pull", "--help"]])
def test_help_works(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "usage: mlxd" in out


def test_serve_help_describes_each_flag_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for text in ("--host HOST", "(default: 127.0.0.1)", "--port N", "(default: 8000)", "--api-key KEY",
                 "--model MODEL", "--model-dir DIR", "--home DIR", "--max-num-seqs N",
                 "--prefill-chunk-tokens N", "--ping-timeout-s SECONDS", "--log-level"):
        assert text in out, text


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert capsys.readouterr().out.startswith("mlxd ")


@pytest.mark.parametrize("argv, expected", [
    (["serve"], {}),
    (["serve", "--port", "9000", "--host", "localhost"], {"port": 9000, "host": "localhost"}),
    (["serve", "--model", "SmolLM2", "--max-num-seqs", "4", "--ping-timeout-s", "30"],
     {"model": "SmolLM2", "max_num_seqs": 4, "ping_timeout_s": 30.0}),
    (["serve", "--host", "0.0.0.0", "--api-key", "k"], {"host": "0.0.0.0", "api_key": "k"}),
])
def test_flags_override_defaults(argv: list[str], expected: dict[str, object]) -> None:
    config = config_from_args(build_parser().parse_args(argv))
    assert config == make_config(expected)


def test_api_key_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    args = build_parser().parse_args(["serve", "--host", "0.0.0.0"])
    assert config_from_args(args).api_key == "from-env"


@pytest.mark.parametrize("argv, flag", [
    (["serve", "--host", "0.0.0.0"], "--api-key"),
    (["serve", "--port", "0"], "--port"),
    (["serve", "--heartbeat-s", "0"], "--heartbeat-s"),
])
def test_invalid_values_name_the_flag(argv: list[str], flag: str, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"error: {flag}:" in err


@pytest.mark.parametrize("argv", [["serve", "--port", "abc"], ["serve", "--log-level", "loud"], ["bogus"], []])
def test_argparse_refusals(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2


def leaf_commands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every runnable subcommand's parser, by its words (`config show`)."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.update(leaf_commands(sub, f"{prefix} {name}".strip()))
    return found or {prefix: parser}


def test_each_subcommand_has_its_handler() -> None:
    commands = leaf_commands(build_parser())
    assert {"serve", "config show", "convert", "pull", "models list", "rm", "service", "status", "wait", "cache",
            "logs", "launch"} == set(commands)
    assert all(callable(sub.get_default("run")) for sub in commands.values())


def test_a_subcommands_own_argument_is_never_taken_for_a_setting() -> None:
    """What is a setting comes from the config's fields: an argument of a subcommand's own
    named like one (`dest="model"`) would override that setting from every run of it."""
    settings = setting_fields().keys() | RENAMED_SETTINGS.keys()
    for words, sub in leaf_commands(build_parser()).items():
        if words == "convert":  # reads no settings: its --dtype is the converter's
            continue
        wrong = [a.dest for a in sub._actions if a.dest in settings and a.default is not argparse.SUPPRESS]
        assert not wrong, f"`mlxd {words}`: {wrong} would be read as settings; give them another dest"


def test_only_settings_are_given_flags() -> None:
    args = build_parser().parse_args(["launch", "codex", "--model", "m", "--client-path", "/bin/true", "--print",
                                      "--home", "/h", "--port", "9", "--log-dir", "/l"])
    assert given_flags(args) == {"home": "/h", "port": 9, "log_dir": "/l"}
    args = build_parser().parse_args(["status", "--json", "--watch", "--count", "2", "--admin-key", "k"])
    assert given_flags(args) == {"admin_key": "k"}


def test_non_loopback_refused_end_to_end() -> None:
    result = run_mlxd("serve", "--host", "0.0.0.0", "--port", "8999")
    assert result.returncode == 2
    assert "--api-key" in result.stderr and "Traceback" not in result.stderr


def test_busy_port_fails_fast(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_mlxd("serve", "--port", str(port), "--model", str(model), "--home", str(tmp_path))
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr and "Traceback" not in result.stderr


# ---------------------------------------------------------------- model resolution

FAKE_CONVERTER = """
import sys, pathlib
src, dest = sys.argv[1], pathlib.Path(sys.argv[2])
if "broken" in src:
    sys.exit(3)
dest.mkdir(parents=True)
(dest / "config.json").write_text("{}")
print("converted", src)
"""


@pytest.fixture
def fake_converter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    script = tmp_path / "convert.py"
    script.write_text(FAKE_CONVERTER)
    calls: list[list[str]] = []

    def command(src: object, dest: object, dtype: object = None) -> list[str]:
        calls.append([str(src), str(dest)])
        return [sys.executable, str(script), str(src), str(dest)]

    monkeypatch.setattr(model_files, "gguf_command", command)
    return calls


def test_model_directory(tmp_path: Path) -> None:
    model = tmp_path / "My-Model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert resolve_model(make_config({"model": str(model)})) == ("My-Model", model.resolve())


def test_model_name_in_model_dir(tmp_path: Path) -> None:
    (tmp_path / "models" / "Named").mkdir(parents=True)
    (tmp_path / "models" / "Named" / "config.json").write_text("{}")
    config = make_config({"model": "Named", "home": str(tmp_path)})
    assert resolve_model(config) == ("Named", tmp_path / "models" / "Named")


@pytest.mark.parametrize("model, message", [
    ("Unknown", "available: Named"),
    ("/no/such/dir", "no such file or directory"),
    ("missing.gguf", "no such file or directory"),
])
def test_unknown_models_are_clear_errors(tmp_path: Path, model: str, message: str) -> None:
    (tmp_path / "models" / "Named").mkdir(parents=True)
    with pytest.raises(ModelNotFound, match=message):
        resolve_model(make_config({"model": model, "home": str(tmp_path)}))


def test_directory_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound, match="no config.json"):
        resolve_model(make_config({"model": str(tmp_path)}))


def test_gguf_is_converted_once(tmp_path: Path, fake_converter: list[list[str]]) -> None:
    gguf = tmp_path / "Tiny-Model.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    config = make_config({"model": str(gguf), "home": str(tmp_path / "home")})
    dest = tmp_path / "home" / "models" / "Tiny-Model.Q4_1"
    assert resolve_model(config) == ("Tiny-Model.Q4_1", dest)
    assert resolve_model(config) == ("Tiny-Model.Q4_1", dest)
    assert len(fake_converter) == 1 and (dest / "config.json").is_file()
    assert not list(dest.parent.glob(".*.tmp"))


def test_failed_conversion_leaves_nothing(tmp_path: Path, fake_converter: list[list[str]]) -> None:
    gguf = tmp_path / "broken.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ModelNotFound, match="exit code 3"):
        resolve_model(make_config({"model": str(gguf), "home": str(tmp_path)}))
    assert not (tmp_path / "models" / "broken").exists()


@pytest.mark.parametrize("stdout, returncode, ok", [
    ("progress\n{model}\n", 0, True),
    ("{model}\n", 1, False),
    ("", 0, False),
])
def test_provision_default_uses_last_stdout_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 stdout: str, returncode: int, ok: bool) -> None:
    model = tmp_path / "SmolLM2-135M-Instruct"
    model.mkdir()
    (model / "config.json").write_text("{}")
    code = f"import sys; sys.stdout.write({stdout.format(model=model)!r}); sys.exit({returncode})"
    monkeypatch.setattr(model_files, "provision_command", lambda home, **_: [sys.executable, "-c", code])
    config = make_config({"home": str(tmp_path)})
    if ok:
        assert resolve_model(config) == ("SmolLM2-135M-Instruct", model)
    else:
        with pytest.raises(ModelNotFound, match="provisioning"):
            resolve_model(config)


@pytest.fixture
def fake_provisioner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    """models.provision stood in for: knows the one name `known-model`, whose directory it
    prints; exits 2 (its unknown-name status) for any other."""
    calls: list[dict[str, object]] = []

    def command(home: Path, name: str | None = None, models_dir: Path | None = None) -> list[str]:
        calls.append({"home": home, "name": name, "models_dir": models_dir})
        model = Path(models_dir or home / "models") / "known-model"
        code = (f"import pathlib, sys\nif {name!r} != 'known-model': sys.exit(2)\n"
                f"p = pathlib.Path({str(model)!r}); p.mkdir(parents=True, exist_ok=True)\n"
                "(p / 'config.json').write_text('{}'); print(p)")
        return [sys.executable, "-c", code]

    monkeypatch.setattr(model_files, "provision_command", command)
    return calls


def test_a_known_name_is_pulled_into_the_model_dir(tmp_path: Path, fake_provisioner: list[dict[str, object]]) -> None:
    config = make_config({"model": "known-model", "home": str(tmp_path), "model_dir": str(tmp_path / "elsewhere")})
    assert resolve_model(config) == ("known-model", tmp_path / "elsewhere" / "known-model")
    assert fake_provisioner == [{"home": tmp_path, "name": "known-model", "models_dir": tmp_path / "elsewhere"}]
    assert resolve_model(config) == ("known-model", tmp_path / "elsewhere" / "known-model")
    assert len(fake_provisioner) == 1  # on disk now: not provisioned again


def test_pull_prints_the_directory_and_refuses_unknown_names(
    tmp_path: Path, fake_provisioner: list[dict[str, object]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["pull", "known-model", "--home", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "models" / "known-model")
    assert cli.main(["pull", "no-such-model", "--home", str(tmp_path)]) == 2


def test_pull_lists_known_names_through_the_real_provisioner(tmp_path: Path) -> None:
    result = run_mlxd("pull", "no-such-model", "--home", str(tmp_path))
    assert result.returncode == 2
    assert "qwen2.5-coder-0.5b" in result.stderr and result.stdout == ""


# ---------------------------------------------------------------- the router process and signals

RUN_ROUTER = """
import asyncio, sys
from pathlib import Path
from router.cli.serve import configure_logging, run_router
from router.config import make_config
from tests.router.router_harness import FAKE_WORKER, FAST
configure_logging("info")
config = make_config({{**FAST, "port": {port}, "home": str(Path({model!r}).parent / "home")}})
sys.exit(asyncio.run(run_router(config, {{"fake-model": Path({model!r})}}, FAKE_WORKER)))
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _spawn_router(tmp_path: Path, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], int]:
    model = tmp_path / "fake-model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    port = _free_port()
    code = RUN_ROUTER.format(port=port, model=str(model))
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env={**os.environ, **(env or {})}, cwd=REPO)
    return process, port


@pytest.mark.timeout(60)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_shuts_down_workers_and_cleans_up(tmp_path: Path, signum: int) -> None:
    process, port = _spawn_router(tmp_path)
    assert process.stdout is not None
    ready = process.stdout.readline()
    assert ready.strip() == f"mlxd ready on http://127.0.0.1:{port} (model fake-model)"
    health = httpx.get(f"http://127.0.0.1:{port}/health").json()
    worker_pid = health["workers"]["fake-model"]["pid"]
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=20)
    assert process.returncode == 0, stderr
    assert not _pid_alive(worker_pid)
    assert "fake worker: shutdown" in stderr and "Traceback" not in stderr
    runtime_dirs = re.findall(r"ipc://(\S+)/workers", stderr)
    assert runtime_dirs and all(not Path(d).exists() for d in runtime_dirs)


@pytest.mark.timeout(60)
def test_signal_while_loading_stops_promptly(tmp_path: Path) -> None:
    process, _ = _spawn_router(tmp_path, env={"FAKE_WORKER_START": "slow"})
    assert process.stderr is not None
    line = ""
    while "spawned worker" not in line:
        line = process.stderr.readline()
        assert line, "router exited early"
    worker_pid = int(re.search(r"\(pid (\d+)\)", line).group(1))  # type: ignore[union-attr]
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=20)
    assert process.returncode == 130
    assert not _pid_alive(worker_pid)


def test_accepted_connections_send_without_waiting_for_acks() -> None:
    """The listening socket has TCP_NODELAY, which accepted connections inherit: without
    it a keep-alive client waited ~40 ms (its delayed ACK) for each answer's second write."""
    listener = listen_socket("127.0.0.1", 0)
    try:
        listener.listen(1)
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        accepted.close()
        client.close()
    finally:
        listener.close()
