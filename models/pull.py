"""`mlxd pull` for what the catalog does not hold: a Hugging Face repo id (`owner/name`, with
an optional `@revision`) or the URL of a .gguf file, made into a model directory.

An MLX repo's files are used as they are, under the repo's name; a GGUF (the file of a URL,
or the one chosen from a GGUF repo) is converted on arrival by models.gguf, under the file's
name without `.gguf`, as `mlxd serve --model FILE.gguf` names it. Everything is fetched into
MODELS/.pull-NAME/, which the next run continues after an interruption; the model appears
under its name by one rename, and only once every file matched its published hash.
`python -m models.pull --home HOME --models-dir DIR SOURCE` prints the directory last.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import sys
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote, urlsplit

from huggingface_hub.utils import disable_progress_bars

from models.assemble import IntegrityError
from models.gguf import convert_gguf
from models.hub_download import (
    RemoteFile,
    RepoListing,
    fetch,
    hub_file,
    list_repo,
    parse_repo,
    seed_from_hf_cache,
    url_file,
)
from models.progress import Progress, ProgressPrinter
from protocol.atomic_files import atomic_replace
from protocol.locks import LockHeld, try_lock

logger = logging.getLogger(__name__)

PULL_MARKER = ".mlxd-pull.json"  # in a pulled directory: its source, commit and files' hashes
STAGING_PREFIX = ".pull-"  # MODELS/.pull-NAME: a pull in progress, continued by the next run
# What an MLX repo needs to be served: mlx-lm's own download list, less custom Python code.
MLX_PATTERNS = ("*.json", "model*.safetensors", "tokenizer.model", "*.tiktoken", "tiktoken.model",
                "*.txt", "*.jsonl", "*.jinja")
# Chosen, in this order, from a repo of several GGUFs when --file does not say: the usual
# balance of size and quality, then the near-lossless one.
PREFERRED_GGUF = ("q4_k_m", "q8_0")
SPLIT_GGUF = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)
FAILED_EXIT = 1


class PullError(ValueError):
    """A pull that cannot go as asked; the message says what to change."""


@dataclass(frozen=True)
class Plan:
    """What one pull fetches and makes: `files` into the staging directory, then that
    directory itself (an MLX repo, `gguf` None) or the conversion of the file `gguf`.
    A repo's files come from `listing`, a URL's one file is `url_file`."""

    name: str
    source: str  # as the marker records it: "owner/name@revision" or the URL
    files: tuple[str, ...]
    gguf: str | None
    listing: RepoListing | None = None
    url_file: RemoteFile | None = None

    def remote(self, name: str) -> RemoteFile:
        """Where to GET `name` now. A repo file's HEAD is made just before its download:
        the CDN URL it redirects to is signed for a limited time."""
        if self.listing is None:
            assert self.url_file is not None and self.url_file.name == name
            return self.url_file
        return hub_file(self.listing, name)

    def marker(self) -> dict[str, Any]:
        """The pull as recorded in its directory (and in its staging directory, so the
        next run knows whether the bytes there continue these files)."""
        if self.listing is None:
            assert self.url_file is not None
            files = {self.url_file.name: {"size": self.url_file.size, "sha256": self.url_file.sha256}}
            commit = None
        else:
            entries = self.listing.entries
            files = {n: {"size": entries[n].size, "sha256": entries[n].sha256, "git_oid": entries[n].git_oid}
                     for n in self.files}
            commit = self.listing.commit
        return {"source": self.source, "commit": commit, "gguf": self.gguf, "files": files}


def is_url(source: str) -> bool:
    return source.startswith(("https://", "http://"))


def is_mlx_repo(names: list[str]) -> bool:
    return "config.json" in names and any(fnmatchcase(n, "model*.safetensors") for n in names)


def mlx_files(names: list[str]) -> list[str]:
    return [n for n in names if any(fnmatchcase(n, pattern) for pattern in MLX_PATTERNS)]


def choose_gguf(names: list[str], wanted: str | None, where: str) -> str:
    """The GGUF to convert among a repo's files: `wanted`, else Q4_K_M, else Q8_0, else the
    only one. Vision projectors (mmproj) and parts of split GGUFs are never chosen alone."""
    candidates = [n for n in names if n.lower().endswith(".gguf")
                  and not PurePosixPath(n).name.lower().startswith("mmproj") and not SPLIT_GGUF.search(n)]
    if wanted is not None:
        if wanted not in names:
            raise PullError(f"{where} has no file {wanted!r}; its .gguf files: {', '.join(candidates) or 'none'}")
        if not wanted.lower().endswith(".gguf") or SPLIT_GGUF.search(wanted):
            raise PullError(f"--file {wanted}: mlxd converts one whole .gguf file; choose one of: "
                            f"{', '.join(candidates) or 'none'}")
        return wanted
    for quantization in PREFERRED_GGUF:
        preferred = [n for n in candidates if quantization in n.lower()]
        if preferred:
            return preferred[0]
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise PullError(f"{where} holds neither an MLX model (config.json and model*.safetensors) nor a "
                        "single-file .gguf mlxd can convert")
    raise PullError(f"{where} holds {len(candidates)} .gguf files and none is Q4_K_M or Q8_0; choose one "
                    f"with --file: {', '.join(candidates)}")


def plan_repo(text: str, gguf_file: str | None, name: str | None) -> Plan:
    """The files of repo `text` to fetch, each with where to GET it and its hash."""
    repo_id, revision = parse_repo(text)
    listing = list_repo(repo_id, revision)
    names = sorted(listing.entries)
    if gguf_file is None and is_mlx_repo(names):
        chosen, gguf, default = mlx_files(names), None, repo_id.split("/")[1]
    else:
        gguf = choose_gguf(names, gguf_file, f"{repo_id}@{revision}")
        chosen, default = [gguf], PurePosixPath(gguf).stem
    return Plan(_checked_name(name or default), f"{repo_id}@{revision}", tuple(chosen), gguf, listing=listing)


def plan_url(url: str, sha256: str | None, name: str | None) -> Plan:
    """The one .gguf file at `url`, converted once fetched."""
    file_name = unquote(PurePosixPath(urlsplit(url).path).name)
    if not file_name.lower().endswith(".gguf"):
        raise PullError(f"{url}: a URL must name a .gguf file (for an MLX model, pull its Hugging Face repo id)")
    if sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise PullError(f"--sha256 {sha256}: expected 64 lowercase hex digits")
    file = url_file(url, sha256)
    return Plan(_checked_name(name or PurePosixPath(file_name).stem), url, (file.name,), file.name, url_file=file)


def make_plan(source: str, *, gguf_file: str | None = None, name: str | None = None,
              sha256: str | None = None) -> Plan:
    if is_url(source):
        if gguf_file is not None:
            raise PullError("--file chooses a file in a repo; a URL names its file itself")
        return plan_url(source, sha256, name)
    if sha256 is not None:
        raise PullError("--sha256 is for a URL; the hub publishes the hash of each file of a repo")
    return plan_repo(source, gguf_file, name)


def pull(plan: Plan, models_dir: Path, home: Path, progress: Progress | None = None) -> Path:
    """MODELS/NAME made from `plan`; returned at once if an earlier pull of the same source made it.

    Raises PullError when NAME is taken by something else or pulled by another process,
    IntegrityError (after removing what was fetched) when a file is not what the server
    published. Any other failure keeps MODELS/.pull-NAME for the next run to continue.
    """
    final = models_dir / plan.name
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        lock = try_lock(home / f".pull-{plan.name}.lock")
    except LockHeld as exc:
        holder = f"pid {exc.pid}" if exc.pid else "another process"
        raise PullError(f"{plan.name} is being pulled by {holder}; wait for it") from None
    with lock:
        if final.exists():
            return _existing(final, plan)
        staging = models_dir / f"{STAGING_PREFIX}{plan.name}"
        _prepare(staging, plan)
        try:
            _fetch_all(plan, staging, progress)
        except IntegrityError:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        except BaseException:
            logger.warning("%s: what was fetched stays in %s; the same pull continues from there",
                           plan.name, staging)
            raise
        with atomic_replace(final) as building:
            if plan.gguf is None:
                os.rename(staging, building)
            else:
                _convert(staging / plan.gguf, building, progress)
                (building / PULL_MARKER).write_text(json.dumps(plan.marker(), indent=2) + "\n")
        shutil.rmtree(staging, ignore_errors=True)  # a GGUF's download, once converted
    logger.info("%s ready at %s", plan.source, final)
    return final


def _existing(final: Path, plan: Plan) -> Path:
    try:
        marker = json.loads((final / PULL_MARKER).read_text())
    except (OSError, ValueError):
        marker = {}
    if marker.get("source") == plan.source and marker.get("gguf") == plan.gguf:
        logger.info("%s: already pulled into %s (commit %s)", plan.source, final, marker.get("commit"))
        return final
    origin = ""
    if marker.get("source"):
        what = f"{marker['source']}, {marker['gguf']}" if marker.get("gguf") else marker["source"]
        origin = f" (pulled from {what})"
    raise PullError(f"{final} already exists{origin}; pull under another name with --as NAME, "
                    f"or remove it first with `mlxd rm {plan.name}`")


def _prepare(staging: Path, plan: Plan) -> None:
    """Keep what an earlier run of this same pull fetched; drop a staging directory left by
    another source or commit, whose bytes would not continue these files."""
    try:
        earlier = json.loads((staging / PULL_MARKER).read_text())
    except (OSError, ValueError):
        earlier = None
    if earlier is not None and earlier != plan.marker():
        logger.info("%s holds another pull's files (%s); starting over", staging, earlier.get("source"))
        shutil.rmtree(staging)
    elif earlier is None and staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True, exist_ok=True)
    (staging / PULL_MARKER).write_text(json.dumps(plan.marker(), indent=2) + "\n")


def _fetch_all(plan: Plan, staging: Path, progress: Progress | None) -> None:
    marker_files = plan.marker()["files"]
    total = sum(marker_files[n]["size"] or 0 for n in plan.files)
    done_before = 0
    for name in plan.files:
        if plan.listing is not None:
            seed_from_hf_cache(plan.listing, name, staging)

        def report(on_disk: int, before: int = done_before) -> None:
            if progress is not None:
                progress("fetch", before + on_disk, max(total, before + on_disk))

        report(0)
        done_before += fetch(plan.remote(name), staging, report).stat().st_size
    if progress is not None:
        progress("fetch", done_before, done_before)


def _convert(gguf: Path, dest: Path, progress: Progress | None) -> None:
    with open(gguf, "rb") as file:
        magic = file.read(4)
    if magic != b"GGUF":
        raise PullError(f"{gguf.name} is not a GGUF file (it starts with {magic!r})")

    def converting(stage: str, done: int, total: int) -> None:
        if progress is not None:
            progress("convert", done, total)

    convert_gguf(gguf, dest, dtype="native", progress=converting)


def _checked_name(name: str) -> str:
    if not name or name.startswith(".") or "/" in name or "\\" in name:
        raise PullError(f"{name!r} cannot name a model directory (no '/', no leading '.')")
    return name


def main(argv: list[str] | None = None) -> int:
    """CLI: progress and logs on stderr, the model directory as the last stdout line; exits
    1 (after one line saying why) when the pull fails."""
    parser = argparse.ArgumentParser(prog="python -m models.pull", description=__doc__)
    parser.add_argument("source", help="owner/name[@revision] on the Hugging Face hub, or a .gguf URL")
    parser.add_argument("--home", type=Path, required=True, help="mlxd home directory (its locks)")
    parser.add_argument("--models-dir", type=Path, required=True, help="where the model directory goes")
    parser.add_argument("--file", default=None, help="the .gguf to convert from a repo of several")
    parser.add_argument("--as", dest="name", default=None, help="the model directory's name")
    parser.add_argument("--sha256", default=None, help="the expected sha256 of a URL's file")
    args = parser.parse_args(argv)
    printer = ProgressPrinter()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s pull %(levelname)s %(message)s")
    # Ours at INFO in a log or a pipe (not the HTTP client's line per request); on a
    # terminal the bars say it all, and log lines would break them mid-line.
    for name in ("models", logger.name):  # logger.name is "__main__" under `python -m`
        logging.getLogger(name).setLevel(logging.WARNING if printer.tty else logging.INFO)
    disable_progress_bars()  # huggingface_hub's own bars would draw over ours
    try:
        plan = make_plan(args.source, gguf_file=args.file, name=args.name, sha256=args.sha256)
        directory = pull(plan, args.models_dir, args.home, printer)
    except KeyboardInterrupt:
        return 130
    except Exception as error:  # the hub's, the network's or the converter's; the traceback at debug
        logger.debug("pull failed", exc_info=True)
        sys.stderr.write(f"error: {_describe(error)}\n")
        return FAILED_EXIT
    print(directory.resolve())
    return 0


def _describe(error: Exception) -> str:
    text = str(error).strip() or type(error).__name__
    return text if isinstance(error, (PullError, OSError, ValueError)) else f"{type(error).__name__}: {text}"


if __name__ == "__main__":
    sys.exit(main())
