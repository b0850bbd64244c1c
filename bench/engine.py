"""Engine speed on one CPU: mlxd against llama.cpp's server and mlx_lm.server.

Same machine, same GGUF file, same thread count, one run. Contenders: mlxd over HTTP with
its default `--dtype auto` (the GGUF's quantization, served by mlxd's quantized CPU
kernels) and with `--dtype float32` for reference; llama.cpp's `llama-server` built
from the tree vendored in the `llama-cpp-python` sdist (built once into .cache/llama.cpp);
`mlx_lm.server` on fp32 weights converted from the same GGUF, with BLIS. Workloads, all
greedy and run to their full token count (EOS biased away, or `ignore_eos`), on prompts no
server has seen: (1) one stream, ~300-token prompt, 128 tokens: decode at batch 1;
(2) one stream, ~1500-token prompt, 128 tokens: cold time to first token, then decode at
context ~1500; (3) 8 concurrent streams, distinct ~300-token prompts, 128 tokens each:
aggregate tok/s. All contenders of a model stay loaded and take turns at each workload,
the order rotating (as bench/batching.py does); every workload runs `--repeats` times on
fresh prompts and each figure is the median. Also measured: each contender's peak RSS,
the machine's memory read bandwidth, and how much of it batch-1 decode reaches. One JSON
object on stdout; progress on stderr. `--help` lists the flags.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from batching import EOS_BIAS, TOPICS, WARMUP_MAX_TOKENS, Contender, make_prompt, measure_interleaved
from common import (
    FP32_MARKER,
    PYTHON,
    REPO,
    Server,
    blas_path,
    emit,
    environment,
    eos_token_ids,
    llamacpp_server,
    log,
    median_of_runs,
    mlxd_server,
    peer_server,
    prepare_fp32_model,
    run_concurrently,
    summarize_streams,
    wait_for_quiet,
)

# The models provisioned for the tests (their GGUFs under HOME/downloads, converted under
# HOME/models), so the benchmark downloads nothing the test suite has not.
HOME = Path(os.environ.get("MLXD_TEST_HOME", REPO / ".cache" / "test-home"))
MODELS = ("smollm2-135m", "qwen2.5-coder-0.5b")  # catalog names (models/catalog.py)
# Every contender gets this many threads: llama.cpp's -t/-tb, BLIS (common.py sets it).
THREADS = len(os.sched_getaffinity(0))

# llama.cpp as vendored by this llama-cpp-python sdist; bump it to benchmark a newer tree.
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
LLAMACPP_DIR = REPO / ".cache" / "llama.cpp"
LLAMACPP_SOURCE = LLAMACPP_DIR / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}" / "vendor" / "llama.cpp"
LLAMACPP_BUILD_DIR = "build-cpu"  # not "build": a GGML_NATIVE build of an earlier run may hold AMX code
LLAMACPP_BINARY = LLAMACPP_SOURCE / LLAMACPP_BUILD_DIR / "bin" / "llama-server"
# ggml's x86 ISA options and the /proc/cpuinfo flag each needs. AMX is left out on
# purpose: VMs (Firecracker here) advertise amx_tile in CPUID without enabling its
# register state, so a GGML_NATIVE build dies with SIGILL at `tilezero` in its first
# matmul. Everything else the CPU has, llama.cpp gets.
GGML_X86_OPTIONS = (("GGML_AVX", "avx"), ("GGML_AVX2", "avx2"), ("GGML_BMI2", "bmi2"), ("GGML_FMA", "fma"),
                    ("GGML_F16C", "f16c"), ("GGML_AVX_VNNI", "avx_vnni"), ("GGML_AVX512", "avx512f"),
                    ("GGML_AVX512_VBMI", "avx512vbmi"), ("GGML_AVX512_VNNI", "avx512_vnni"),
                    ("GGML_AVX512_BF16", "avx512_bf16"))


def _cpu_flags() -> set[str]:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def llamacpp_build_commands() -> list[list[str]]:
    """cmake's configure and build commands: on x86 Linux each ISA option ggml has, set
    from what this CPU lists (AMX never); elsewhere GGML_NATIVE."""
    flags = _cpu_flags()
    if flags and "avx" in flags:
        isa = ["-DGGML_NATIVE=OFF", *(f"-D{option}={'ON' if flag in flags else 'OFF'}"
                                       for option, flag in GGML_X86_OPTIONS)]
    else:
        isa = ["-DGGML_NATIVE=ON"]
    return [["cmake", "-B", LLAMACPP_BUILD_DIR, "-DCMAKE_BUILD_TYPE=Release", *isa, "-DLLAMA_CURL=OFF"],
            ["cmake", "--build", LLAMACPP_BUILD_DIR, "--target", "llama-server", "-j", str(THREADS)]]


# What the build's CMakeCache.txt says about the kernels llama.cpp runs.
LLAMACPP_CMAKE_KEYS = ("CMAKE_BUILD_TYPE", "GGML_NATIVE", "GGML_BLAS", "GGML_BLAS_VENDOR", "GGML_OPENMP",
                       "GGML_LLAMAFILE", "GGML_CPU_REPACK", *(option for option, _ in GGML_X86_OPTIONS))

REPEAT_KEYS = ("aggregate_tok_s", "ttft_p50_s", "stream_decode_tok_s_mean", "other_cpu_cores", "error")
RSS_INTERVAL_S = 0.2
BANDWIDTH_BYTES = 1 << 30


@dataclass(frozen=True)
class Workload:
    """One measured shape: `num_streams` concurrent requests of ~`prompt_tokens` tokens."""

    name: str
    prompt_tokens: int
    num_streams: int


# batch-1 decode at a short context; cold prefill of a long prompt, then batch-1 decode at
# that context; concurrent streams of short prompts (each name's figures: headline_figures)
WORKLOAD_NAMES = ("decode_short", "prefill_long", "aggregate")


# ---------------------------------------------------------------- llama.cpp, built once


def ensure_llama_server() -> Path:
    """The llama-server binary, built from the sdist's vendored llama.cpp on first use
    (a few minutes on 2 cores; cmake's output is the progress, on stderr)."""
    if LLAMACPP_BINARY.is_file():
        return LLAMACPP_BINARY
    if not (LLAMACPP_SOURCE / "CMakeLists.txt").is_file():
        sdist_dir = LLAMACPP_DIR / "sdist"
        requirement = f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"
        log("downloading the %s sdist into %s", requirement, sdist_dir)
        subprocess.run([PYTHON, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", requirement,
                        "-d", str(sdist_dir)], check=True, stdout=sys.stderr)
        (sdist,) = sdist_dir.glob(f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz")
        staging = LLAMACPP_DIR / ".unpacking"
        shutil.rmtree(staging, ignore_errors=True)  # what an interrupted run left
        with tarfile.open(sdist) as archive:
            archive.extractall(staging, filter="data")
        # renamed into place whole, so a half-unpacked tree never looks complete
        (staging / LLAMACPP_SOURCE.parents[1].name).rename(LLAMACPP_SOURCE.parents[1])
        staging.rmdir()
    log("building llama-server in %s (takes minutes; later runs reuse it)", LLAMACPP_SOURCE)
    for command in llamacpp_build_commands():
        log("running %s", shlex.join(command))
        subprocess.run(command, cwd=LLAMACPP_SOURCE, check=True, stdout=sys.stderr)
    return LLAMACPP_BINARY


def llamacpp_build_info(binary: Path) -> dict[str, Any]:
    """Which llama.cpp this is and how it was built: its --version, its git commit (the
    sdist ships the submodule's git directory), the build's cmake options and the flags
    its CPU kernels were compiled with (GGML_NATIVE: -march=native, resolved by gcc)."""
    build = LLAMACPP_SOURCE / LLAMACPP_BUILD_DIR
    text = _output([str(binary), "--version"])
    commit = _output(["git", "rev-parse", "HEAD"], cwd=LLAMACPP_SOURCE).strip()
    cmake_cache: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in (build / "CMakeCache.txt").read_text().splitlines():
            key, _, value = line.partition("=")
            name = key.partition(":")[0]
            if name in LLAMACPP_CMAKE_KEYS:
                cmake_cache[name] = value
    cpu_flags = None
    with contextlib.suppress(OSError):
        flags = (build / "ggml" / "src" / "CMakeFiles" / "ggml-cpu.dir" / "flags.make").read_text()
        cpu_flags = " ".join(re.findall(r"^CXX_FLAGS = (.*)$", flags, re.M)) or None
    march = re.search(r"^\s*-march=\s*(\S+)", _output(["gcc", "-march=native", "-Q", "--help=target"]), re.M)
    return {
        "binary": str(binary),
        "source": f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist, vendor/llama.cpp",
        "version": " ".join(re.findall(r"^version: .*$", text, re.M)) or None,
        "built_with": " ".join(re.findall(r"^built with .*$", text, re.M)) or None,
        "commit": commit if re.fullmatch(r"[0-9a-f]{40}", commit) else None,
        "build_commands": [shlex.join(c) for c in llamacpp_build_commands()],
        "cmake": cmake_cache,
        "cpu_kernel_cxx_flags": cpu_flags,
        "march_native": march.group(1) if march else None,
    }


def _output(command: list[str], cwd: Path | None = None) -> str:
    """What a short command prints (stdout and stderr), or "" if it cannot run."""
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout + done.stderr


def _llamacpp_log_facts(log_path: Path) -> dict[str, Any]:
    """What llama-server's start-up log says about its threads, slots and KV cache."""
    text = log_path.read_text(errors="replace")
    patterns = {"n_threads": r"n_threads = (\d+)", "n_slots": r"n_slots = (\d+)",
                "n_ctx_slot": r"n_ctx_slot = (\d+)", "kv_unified": r"kv_unified = '?(\w+)"}
    facts = {}
    for key, pattern in patterns.items():
        if match := re.search(pattern, text):
            facts[key] = match.group(1).strip()
    return facts


# ---------------------------------------------------------------- weights and memory


def gguf_summary(path: Path) -> dict[str, Any]:
    """The GGUF's size, its tensors' bytes and parameters, their types, and its input
    embedding table when the file has a separate output matrix (a token reads one row of
    that table, not all of it, so it does not count towards the bytes read per token)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    names = {t.name for t in reader.tensors}
    untied = [t for t in reader.tensors if t.name == "token_embd.weight" and "output.weight" in names]
    return {
        "path": str(path),
        "file_bytes": path.stat().st_size,
        "tensor_bytes": sum(int(t.n_bytes) for t in reader.tensors),
        "params": sum(int(t.n_elements) for t in reader.tensors),
        "tensor_types": dict(Counter(t.tensor_type.name for t in reader.tensors).most_common()),
        "untied_input_embedding": {"params": int(untied[0].n_elements), "bytes": int(untied[0].n_bytes)}
        if untied else None,
    }


def bytes_per_token(weights_bytes: int, gguf: dict[str, Any], exact_embedding_bytes: int | None = None) -> int:
    """Weight bytes one decode step reads: all served weights but an untied input embedding
    table (its bytes as served: `exact_embedding_bytes`, else its share of the parameters)."""
    embedding = gguf["untied_input_embedding"]
    if embedding is None:
        return weights_bytes
    if exact_embedding_bytes is None:
        exact_embedding_bytes = round(weights_bytes * embedding["params"] / gguf["params"])
    return weights_bytes - exact_embedding_bytes


def measure_read_bandwidth(num_bytes: int = BANDWIDTH_BYTES, num_threads: int = THREADS,
                           passes: int = 5) -> dict[str, Any]:
    """Memory read bandwidth: `num_threads` threads each sum their slice of a `num_bytes`
    float32 array (numpy drops the GIL in the reduction), best of `passes` passes."""
    import numpy as np

    data = np.ones(num_bytes // 4, dtype=np.float32)  # ones: every page is touched once here
    slices = np.array_split(data, num_threads)
    rates = []
    with ThreadPoolExecutor(num_threads) as pool:
        for _ in range(passes):
            started = time.perf_counter()
            list(pool.map(np.sum, slices))
            rates.append(num_bytes / (time.perf_counter() - started))
    del data, slices
    return {"bytes_per_s": round(max(rates)), "gb_per_s": round(max(rates) / 1e9, 2),
            "passes_gb_per_s": [round(r / 1e9, 2) for r in rates],
            "method": f"numpy float32 sum of a {num_bytes >> 20} MiB array split across {num_threads} "
                      f"threads, best of {passes} passes"}


def _role(process: psutil.Process) -> str:
    """A process's part in its tree: the module it runs (`-m worker`), else its program
    (MLX's CPU backend runs the compiler for fused kernels: `g++`, `cc1plus` show up)."""
    argv = process.cmdline()
    if "-m" in argv[:-1]:
        return argv[argv.index("-m") + 1]
    if argv and Path(argv[0]).name.startswith("python") and len(argv) > 1:
        return Path(argv[1]).name
    return Path(argv[0]).name if argv else process.name()


class PeakMemory:
    """Peak resident memory of watched process trees, sampled on a thread every
    RSS_INTERVAL_S: per tree (the sum over its processes, so pages two of them share count
    twice) and per role in the tree (`worker`, `kvstore`, ...). A context manager: the
    sampling runs while it is entered."""

    def __init__(self) -> None:
        self._roots: dict[str, int] = {}
        self._peaks: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-rss", daemon=True)

    def watch(self, name: str, pid: int) -> None:
        with self._lock:
            self._roots[name] = pid
            self._peaks[name] = {"tree_bytes": 0, "processes": {}, "num_samples": 0}
        self.sample()

    def peaks(self, name: str) -> dict[str, Any]:
        with self._lock:
            peak = self._peaks.get(name, {})
            return {**peak, "processes": dict(peak.get("processes", {})), "interval_s": RSS_INTERVAL_S}

    def sample(self) -> None:
        with self._lock:
            roots = dict(self._roots)
        for name, pid in roots.items():
            by_role: Counter[str] = Counter()
            with contextlib.suppress(psutil.Error):
                root = psutil.Process(pid)
                for process in [root, *root.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):  # it may exit between listing and reading
                        if rss := process.memory_info().rss:  # none: a zombie, or a child not yet exec'd
                            by_role[_role(process)] += rss
            if not by_role:
                continue
            with self._lock:
                peak = self._peaks[name]
                peak["num_samples"] += 1
                peak["tree_bytes"] = max(peak["tree_bytes"], sum(by_role.values()))
                for role, rss in by_role.items():
                    peak["processes"][role] = max(peak["processes"].get(role, 0), rss)

    def _run(self) -> None:
        while not self._stop.wait(RSS_INTERVAL_S):
            self.sample()

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# ---------------------------------------------------------------- contenders


@dataclass
class EngineContender:
    """One server under test, loaded and warmed up, kept alive while its model is measured.

    `request` holds what makes its requests comparable to everyone else's: greedy, run to
    max_tokens (mlxd and mlx-lm bias EOS away; llama.cpp has `ignore_eos`), and computed
    cold (llama.cpp's `cache_prompt` off; every prompt is new to every server anyway)."""

    name: str
    server: Server
    request: dict[str, Any]
    setup: dict[str, Any] = field(default_factory=dict)

    @property
    def pids(self) -> list[int]:
        return [self.server.process.pid]

    def run(self, prompts: list[str], max_tokens: int) -> dict[str, Any]:
        bodies = [{"model": self.server.model, "prompt": prompt, "max_tokens": max_tokens,
                   "temperature": 0.0, **self.request} for prompt in prompts]
        return summarize_streams(run_concurrently(self.server.base_url, bodies))


def _mlxd_loaded(log_path: Path) -> dict[str, Any]:
    """The worker's load line, field by field: the dtype, quantized layers, BLAS, kernels
    and weight bytes it serves (the last load: a restarted worker logs again)."""
    lines = re.findall(r"worker: loaded \S+ in [\d.]+s: .*", log_path.read_text(errors="replace"))
    if not lines:
        return {}
    line = lines[-1]
    fields = {"dtype": r"s: (\S+)", "device": r" on (\w+)", "quantized_layers": r"\(quantized: ([^)]*)\)",
              "blas": r"BLAS (.+?), (?:attention|kernels) ", "kernels": r"(?:attention|kernels) (.+?), \d+ MB",
              "weights_mb": r"(\d+) MB of weights"}
    loaded: dict[str, Any] = {"line": line.partition("worker: ")[2]}
    for key, pattern in fields.items():
        if match := re.search(pattern, line):
            loaded[key] = int(match.group(1)) if key == "weights_mb" else match.group(1)
    return loaded


def _mlxd_setup(server: Server, dtype: str, model_dir: Path) -> dict[str, Any]:
    """How this mlxd serves: its command, /health's worker (dtype, quantization, BLAS,
    attention kernels, weight bytes), its /admin/status model entry and the worker's
    load line; the weight bytes from /health, else /admin/status, else the load line."""
    with httpx.Client(timeout=10.0) as client:
        status = client.get(f"{server.base_url}/admin/status").json()
    model = next((m for m in status.get("models", []) if m.get("id") == server.model), {})
    loaded = _mlxd_loaded(server.log_path)
    candidates = [("/health", server.info.get("weights_bytes")), ("/admin/status", model.get("weights_bytes")),
                  ("worker load line (MB)", loaded["weights_mb"] * 1_000_000 if "weights_mb" in loaded else None)]
    source, weights_bytes = next(((s, b) for s, b in candidates if b), (None, None))
    config = json.loads((model_dir / "config.json").read_text())
    return {
        "command": shlex.join(server.process.args),
        "model_dir": str(model_dir),
        "dtype_flag": dtype,
        "model_dir_quantization": config.get("quantization"),
        "worker": {**server.info, "dtype": server.info.get("dtype") or loaded.get("dtype")},
        "worker_load_line": loaded,
        "status_model": {k: v for k, v in model.items() if k not in ("last_used", "ttl_left_s", "hot_cache")},
        "weights_bytes": weights_bytes,
        "weights_bytes_from": source,
        "threads": {"blis": os.environ.get("BLIS_NUM_THREADS"), "cpus": THREADS},
        "cache": "prefix cache on (default), throwaway home; no prompt repeats, so no hits",
        "log": str(server.log_path),
    }


def llamacpp_setup(server: Server, gguf: Path, gguf_info: dict[str, Any], llama_build: dict[str, Any],
                   cache: str) -> dict[str, Any]:
    """How this llama-server serves: its command, weights, threads, slots and window (from
    /props and its start-up log), its build, and `cache`: what the caller set about its
    prompt cache."""
    with httpx.Client(timeout=10.0) as client:
        props = client.get(f"{server.base_url}/props").json()
    settings = props.get("default_generation_settings") or {}
    return {
        "command": shlex.join(server.process.args),
        "weights": {"file": str(gguf), "types": gguf_info["tensor_types"]},
        "threads": THREADS, "parallel_slots": props.get("total_slots"),
        "n_ctx": settings.get("n_ctx"), "build_info": props.get("build_info"),
        "build": llama_build, "log_facts": _llamacpp_log_facts(server.log_path),
        "blas": f"GGML_BLAS={llama_build['cmake'].get('GGML_BLAS')}",
        "cache": cache,
        "model_ftype": props.get("model_ftype"),
        "log": str(server.log_path),
    }


def _warm_up(contender: EngineContender, warmup_prompt: str) -> EngineContender:
    """One request of the measured shape on a topic of its own, so first-touch costs
    (allocator growth, page faults, lazy imports) land in no measured figure."""
    contender.run([warmup_prompt], WARMUP_MAX_TOKENS)
    return contender


@contextlib.contextmanager
def start_contenders(model: str, model_dir: Path, gguf: Path, gguf_info: dict[str, Any], args: argparse.Namespace,
                     warmup_prompt: str, logit_bias: dict[str, float], llama_build: dict[str, Any] | None,
                     memory: PeakMemory, errors: dict[str, str]) -> Iterator[list[EngineContender]]:
    """Start, check and warm up every contender of one model; stop them all on exit. A
    contender that fails to start is reported in `errors`; the others still run."""
    eos_request = {"logit_bias": logit_bias}
    contenders: list[EngineContender] = []
    with contextlib.ExitStack() as stack:

        def add(name: str, start: Callable[[], EngineContender]) -> None:
            try:
                contender = start()
                memory.watch(name, contender.server.process.pid)
                contenders.append(_warm_up(contender, warmup_prompt))
            except Exception as exc:  # report what the others measure anyway
                log("%s failed to start: %s", name, exc)
                errors[name] = f"{type(exc).__name__}: {exc}"

        for name, dtype in (("mlxd", "auto"), ("mlxd_fp32", "float32")):
            def start_mlxd(name: str = name, dtype: str = dtype) -> EngineContender:
                server = stack.enter_context(mlxd_server(
                    model_dir, max_num_seqs=args.streams, prefill_chunk_tokens=args.prefill_chunk_tokens,
                    extra_args=["--dtype", dtype], name=name))
                return EngineContender(name, server, eos_request, _mlxd_setup(server, dtype, model_dir))
            add(name, start_mlxd)

        if llama_build is not None:
            def start_llamacpp() -> EngineContender:
                slot_tokens = -(-(args.long_prompt_tokens * 11 // 10 + args.max_tokens) // 256) * 256
                server = stack.enter_context(llamacpp_server(Path(llama_build["binary"]), gguf, threads=THREADS,
                                                             parallel=args.streams,
                                                             ctx_size=args.streams * slot_tokens))
                setup = llamacpp_setup(server, gguf, gguf_info, llama_build,
                                       "cache_prompt false in every request (ignore_eos true); --cache-ram, "
                                       "--flash-attn, -b/-ub at their defaults")
                return EngineContender("llamacpp", server, {"ignore_eos": True, "cache_prompt": False}, setup)
            add("llamacpp", start_llamacpp)

        if not args.skip_peer:
            def start_peer() -> EngineContender:
                fp32_dir = prepare_fp32_model(gguf=gguf, name=model_dir.name)
                server = stack.enter_context(peer_server(fp32_dir, max_num_seqs=args.streams,
                                                         prefill_chunk_tokens=args.prefill_chunk_tokens))
                marker = json.loads((fp32_dir / FP32_MARKER).read_text())
                return EngineContender("mlx_lm", server, eos_request, {
                    "command": shlex.join(server.process.args),
                    "weights": {"model_dir": str(fp32_dir), "dtype": "float32",
                                "converted_from": marker.get("source"), "source_sha256": marker.get("source_sha256")},
                    **server.info, "threads": {"blis": os.environ.get("BLIS_NUM_THREADS"), "cpus": THREADS},
                    "cache": "mlx_lm.server's prompt cache at its defaults; no prompt repeats, so no hits",
                    "log": str(server.log_path),
                })
            add("mlx_lm", start_peer)
        log("%s: contenders up: %s", model, ", ".join(c.name for c in contenders) or "none")
        yield contenders


# ---------------------------------------------------------------- prompts and measurement


def make_workload_prompts(model_dir: Path, workloads: list[Workload],
                          repeats: int) -> tuple[list[dict[str, list[str]]], str, dict[str, list[int]]]:
    """Distinct prompts per workload and repeat (the same for every contender of a model),
    the warm-up prompt (short, a topic of its own) and each workload's prompt lengths.
    No two share a first token, so no server reuses a cached prefix between them."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text).ids)

    needed = repeats * sum(w.num_streams for w in workloads) + 1
    if needed > len(TOPICS):
        raise SystemExit(f"--repeats {repeats} needs {needed} distinct prompts; only {len(TOPICS)} topics exist")
    index = iter(range(len(TOPICS)))
    sets = [{w.name: [make_prompt(next(index), w.prompt_tokens, count_tokens) for _ in range(w.num_streams)]
             for w in workloads} for _ in range(repeats)]
    warmup = make_prompt(next(index), min(w.prompt_tokens for w in workloads), count_tokens)
    prompts = [p for per_repeat in sets for ps in per_repeat.values() for p in ps] + [warmup]
    if len({tokenizer.encode(p).ids[0] for p in prompts}) != len(prompts):
        raise RuntimeError("two benchmark prompts share their first token; a server could reuse a cache")
    lengths = {w.name: [count_tokens(p) for per_repeat in sets for p in per_repeat[w.name]] for w in workloads}
    return sets, warmup, lengths


def measure(contenders: list[EngineContender], prompt_sets: list[dict[str, list[str]]], max_tokens: int,
            quiet_wait_s: float) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Each workload in turn, its repeats on every contender, through batching.py's
    `measure_interleaved` (N = the workload's concurrent streams): the order rotates from
    one repeat and one workload to the next, each run waits for a quiet machine and meters
    other load. Returns contender -> workload -> one summary per repeat."""
    turns = [Contender(c.name, c.pids, functools.partial(c.run, max_tokens=max_tokens)) for c in contenders]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    if not turns:
        return runs
    for index, workload in enumerate(prompt_sets[0]):
        num_streams = len(prompt_sets[0][workload])
        log("workload %s: %d stream(s), %d repeat(s)", workload, num_streams, len(prompt_sets))
        rotated = turns[index % len(turns):] + turns[:index % len(turns)]
        per_n = measure_interleaved(rotated, [{num_streams: sets[workload]} for sets in prompt_sets], quiet_wait_s)
        for name, per_repeat in per_n.get(num_streams, {}).items():
            runs.setdefault(name, {})[workload] = per_repeat
    return runs


# ---------------------------------------------------------------- figures


def _ratio(numerator: Any, denominator: Any, digits: int = 3) -> float | None:
    if not isinstance(numerator, (int, float)) or not isinstance(denominator, (int, float)) or not denominator:
        return None
    return round(numerator / denominator, digits)


def headline_figures(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A contender's figures the ratios are taken from (medians over the repeats)."""
    decode, prefill, aggregate = (results.get(name, {}) for name in WORKLOAD_NAMES)
    return {
        "decode_tok_s_short_ctx": decode.get("stream_decode_tok_s_mean"),
        "decode_tok_s_long_ctx": prefill.get("stream_decode_tok_s_mean"),
        "ttft_cold_long_s": prefill.get("ttft_p50_s"),
        "prefill_tok_s_long": _ratio(prefill.get("mean_prompt_tokens"), prefill.get("ttft_p50_s"), 1),
        "aggregate_tok_s": aggregate.get("aggregate_tok_s"),
    }


def ratios(mine: dict[str, Any], theirs: dict[str, Any], suffix: str) -> dict[str, float | None]:
    """Above 1 means mlxd is faster: tok/s over tok/s, and their TTFT over mine."""
    return {
        f"decode_ratio_vs_{suffix}": _ratio(mine.get("decode_tok_s_short_ctx"), theirs.get("decode_tok_s_short_ctx")),
        f"aggregate8_ratio_vs_{suffix}": _ratio(mine.get("aggregate_tok_s"), theirs.get("aggregate_tok_s")),
        f"prefill_ratio_vs_{suffix}": _ratio(theirs.get("ttft_cold_long_s"), mine.get("ttft_cold_long_s")),
    }


def bandwidth_figures(name: str, setup: dict[str, Any], gguf: dict[str, Any], decode_tok_s: Any,
                      bandwidth: dict[str, Any]) -> dict[str, Any]:
    """Weight bytes one batch-1 decode step reads, and the fraction of the measured read
    bandwidth that tok/s x those bytes is (KV-cache and activation reads not counted)."""
    fp32_bytes = 4 * gguf["params"]
    embedding = gguf["untied_input_embedding"]
    if name in ("mlxd_fp32", "mlx_lm"):
        served, source = fp32_bytes, "4 bytes x parameters (fp32)"
        per_token = bytes_per_token(served, gguf, 4 * embedding["params"] if embedding else None)
    elif name == "llamacpp":
        served, source = gguf["tensor_bytes"], "the GGUF's tensor data"
        per_token = bytes_per_token(served, gguf, embedding["bytes"] if embedding else None)
    elif setup.get("weights_bytes"):
        served, source = setup["weights_bytes"], f"mlxd's worker ({setup['weights_bytes_from']})"
        per_token = bytes_per_token(served, gguf)
    else:
        served, source = gguf["tensor_bytes"], "the GGUF's tensor data (the worker reported none)"
        per_token = bytes_per_token(served, gguf, embedding["bytes"] if embedding else None)
    rate = decode_tok_s if isinstance(decode_tok_s, (int, float)) else None
    fraction = _ratio(per_token * rate, bandwidth["bytes_per_s"]) if rate is not None else None
    return {"served_weights_bytes": served, "served_weights_from": source, "bytes_per_token": per_token,
            "decode_tok_s_short_ctx": decode_tok_s, "fraction": fraction}


def run_model(name: str, args: argparse.Namespace, workloads: list[Workload], llama_build: dict[str, Any] | None,
              bandwidth: dict[str, Any]) -> dict[str, Any]:
    """Provision, start every contender, measure, and report one model."""
    from models.catalog import find_model
    from models.provision import provision_model

    started = time.perf_counter()
    catalog_model = find_model(name)
    model_dir = provision_model(HOME, catalog_model)
    gguf = HOME / "downloads" / catalog_model.gguf_file
    gguf_info = gguf_summary(gguf)
    prompt_sets, warmup, lengths = make_workload_prompts(model_dir, workloads, args.repeats)
    stop_ids = eos_token_ids(model_dir)
    logit_bias = {str(t): EOS_BIAS for t in stop_ids}
    log("%s: %s (%s); prompts %s; EOS ids %s biased by %s", name, model_dir, gguf.name,
        {w: (min(n), max(n)) for w, n in lengths.items()}, stop_ids, EOS_BIAS)

    errors: dict[str, str] = {}
    with PeakMemory() as memory:
        with start_contenders(name, model_dir, gguf, gguf_info, args, warmup, logit_bias, llama_build,
                              memory, errors) as contenders:
            setups = {c.name: c.setup for c in contenders}
            runs = measure(contenders, prompt_sets, args.max_tokens, args.quiet_wait_s)
        peaks = {c.name: memory.peaks(c.name) for c in contenders}
    contender_reports: dict[str, Any] = {}
    for contender_name, per_workload in runs.items():
        results = {w: median_of_runs(r, REPEAT_KEYS) for w, r in per_workload.items()}
        for workload, per_repeat in per_workload.items():
            for repeat, run in enumerate(per_repeat):
                if "error" in run:
                    errors[f"{contender_name} {workload} repeat {repeat + 1}"] = run["error"]
        figures = headline_figures(results)
        contender_reports[contender_name] = {
            "figures": figures,
            "bandwidth_batch1": bandwidth_figures(contender_name, setups[contender_name], gguf_info,
                                                  figures["decode_tok_s_short_ctx"], bandwidth),
            "setup": setups[contender_name],
            "peak_rss": peaks[contender_name],
            "results": results,
        }
    full_length = all(r.get("min_completion_tokens") == args.max_tokens for c in contender_reports.values()
                      for r in c["results"].values() if "error" not in r)
    if not full_length:
        log("warning: some requests stopped before %d tokens (see min_completion_tokens)", args.max_tokens)

    def figures_of(contender_name: str) -> dict[str, Any]:
        return contender_reports.get(contender_name, {}).get("figures", {})

    def fraction_of(contender_name: str) -> Any:
        return contender_reports.get(contender_name, {}).get("bandwidth_batch1", {}).get("fraction")

    return {
        **ratios(figures_of("mlxd"), figures_of("llamacpp"), "llamacpp"),
        **ratios(figures_of("mlxd"), figures_of("mlx_lm"), "mlx_lm"),
        "bandwidth_fraction_batch1": fraction_of("mlxd"),
        "mlxd_served": {k: contender_reports.get("mlxd", {}).get("setup", {}).get("worker", {}).get(k)
                        for k in ("dtype", "quantization", "weights_bytes", "attention")},
        "fp32_reference": {
            **ratios(figures_of("mlxd_fp32"), figures_of("llamacpp"), "llamacpp"),
            **ratios(figures_of("mlxd_fp32"), figures_of("mlx_lm"), "mlx_lm"),
            "bandwidth_fraction_batch1": fraction_of("mlxd_fp32"),
        },
        "figures": {c: r["figures"] for c, r in contender_reports.items()},
        "bandwidth_fraction_batch1_by_contender": {c: fraction_of(c) for c in contender_reports},
        "all_requests_generated_max_tokens": full_length,
        "gguf": gguf_info,
        "model_dir": str(model_dir),
        "prompt_tokens": {w: {"min": min(n), "max": max(n)} for w, n in lengths.items()},
        "eos_logit_bias": logit_bias,
        "contenders": contender_reports,
        "errors": errors,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"catalog names, comma-separated (default {','.join(MODELS)})")
    parser.add_argument("--repeats", type=int, default=3,
                        help="measure every workload this many times, on fresh prompts, and report medians (default 3)")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens each request generates (default 128)")
    parser.add_argument("--short-prompt-tokens", type=int, default=300,
                        help="prompt length for batch-1 decode and the concurrent streams (default 300)")
    parser.add_argument("--long-prompt-tokens", type=int, default=1500,
                        help="prompt length for the cold prefill and decode at long context (default 1500)")
    parser.add_argument("--streams", type=int, default=8,
                        help="concurrent streams of the aggregate workload; also mlxd's --max-num-seqs, "
                             "mlx_lm.server's concurrency and llama.cpp's --parallel (default 8)")
    parser.add_argument("--prefill-chunk-tokens", type=int, default=512,
                        help="prefill step for mlxd and mlx_lm.server (mlxd's default, 512; llama.cpp's "
                             "ubatch is 512 too)")
    parser.add_argument("--quiet-wait-s", type=float, default=30.0,
                        help="before each measurement, wait up to this long for other processes "
                             "to leave the CPUs idle (default 30; the load seen is reported)")
    parser.add_argument("--skip-llamacpp", action="store_true", help="do not build or run llama-server")
    parser.add_argument("--skip-peer", action="store_true", help="do not run mlx_lm.server")
    parser.add_argument("--out", type=Path, help="also write the JSON to this file")
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models:
        parser.error("--models names no model")
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    workloads = [
        Workload(WORKLOAD_NAMES[0], args.short_prompt_tokens, 1),
        Workload(WORKLOAD_NAMES[1], args.long_prompt_tokens, 1),
        Workload(WORKLOAD_NAMES[2], args.short_prompt_tokens, args.streams),
    ]

    started = time.perf_counter()
    env = environment()
    llama_build = None
    if not args.skip_llamacpp:
        try:
            llama_build = llamacpp_build_info(ensure_llama_server())
        except Exception as exc:  # measure the others anyway; the JSON says why it is missing
            log("llama-server unavailable: %s", exc)
            env["llamacpp_build_error"] = f"{type(exc).__name__}: {exc}"
    env["llamacpp_build"] = llama_build
    wait_for_quiet(args.quiet_wait_s)
    bandwidth = measure_read_bandwidth()
    log("memory read bandwidth %.2f GB/s (%s)", bandwidth["gb_per_s"], bandwidth["method"])
    env["memory_read_bandwidth"] = bandwidth
    env["threads"] = THREADS
    reports = {}
    for model in models:
        try:
            reports[model] = run_model(model, args, workloads, llama_build, bandwidth)
        except Exception as exc:
            log("%s failed: %s", model, exc)
            reports[model] = {"errors": {"model": f"{type(exc).__name__}: {exc}"}}
    env["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    report = {
        "benchmark": "engine",
        "config": {
            "models": models, "repeats": args.repeats, "max_tokens": args.max_tokens, "streams": args.streams,
            "workloads": {w.name: {"prompt_tokens_target": w.prompt_tokens, "num_streams": w.num_streams}
                          for w in workloads},
            "prefill_chunk_tokens": args.prefill_chunk_tokens, "threads": THREADS,
            "endpoint": "/v1/completions (streaming, greedy, temperature 0)",
            "decode_rate": "per stream, tokens after the first / first to last token (client clock)",
            "ttft": "request sent to first streamed content (client clock)",
            "bytes_per_token_rule": "served weight bytes, less an untied input embedding table (a token "
                                    "reads one row of it); KV-cache reads not counted",
            "peak_rss": "psutil RSS sampled every %.1f s from ready to stop; tree_bytes sums a server's "
                        "processes, `processes` has each role's own peak (mlxd's: mlxd = the router, "
                        "worker, kvstore)" % RSS_INTERVAL_S,
            "blas": blas_path() or "reference",
        },
        "environment": env,
        "models": reports,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    emit(report, args.out)
    return 1 if any("mlxd" in r.get("errors", {}) or "model" in r.get("errors", {}) for r in reports.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
