"""Files of a Hugging Face repo, or one file by URL, fetched into a directory: each grows in
`NAME.part`, which a later run continues with an HTTP Range request instead of starting
over, and takes its name only once its size and hash are the ones the server published.

huggingface_hub does the HTTP, so HF_ENDPOINT, HF_TOKEN and HF_HOME apply as they do for its
other users. Its `http_get` checks a download's size, not its content, and its own download
functions delete a partial file when interrupted; hence the `.part` files and the hash
checks here (sha256 for LFS files, the git blob id for small files kept in git).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

from huggingface_hub import (
    HfApi,
    constants,
    get_hf_file_metadata,
    hf_hub_url,
    try_to_load_from_cache,
)
from huggingface_hub.file_download import http_get
from huggingface_hub.utils import build_hf_headers, validate_repo_id

from models.assemble import CHUNK_BYTES, IntegrityError, sha256_of

logger = logging.getLogger(__name__)

PART_SUFFIX = ".part"
DEFAULT_REVISION = "main"
SHA256 = re.compile(r"[0-9a-f]{64}")

# Bytes of the file being fetched now on disk, after each chunk (for a progress bar).
OnBytes = Callable[[int], None]


@dataclass(frozen=True)
class RemoteFile:
    """One file to fetch, and what it must be once fetched.

    `sha256` is checked when it is known (LFS files, a hub URL, a hash the user gave); a
    small repo file kept in git has none, and is checked by its `git_oid` instead.
    """

    name: str  # where it goes, relative to the destination directory ("/"-separated)
    url: str
    size: int | None
    sha256: str | None = None
    git_oid: str | None = None
    headers: dict[str, str] = field(default_factory=dict, repr=False)  # may hold the token


@dataclass(frozen=True)
class RepoEntry:
    """A file of a repo as the hub lists it (`model_info(files_metadata=True)`)."""

    size: int | None
    sha256: str | None  # LFS files only
    git_oid: str | None  # files kept in git


@dataclass(frozen=True)
class RepoListing:
    """A repo's files at one commit: every file of a pull comes from that commit, even
    when the branch moves while it runs."""

    repo_id: str
    revision: str
    commit: str
    entries: dict[str, RepoEntry]


def parse_repo(text: str) -> tuple[str, str]:
    """`owner/name[@revision]` -> (repo id, revision); ValueError saying what is wrong."""
    repo_id, _, revision = text.partition("@")
    if repo_id.count("/") != 1:
        raise ValueError(f"{text!r} is not a Hugging Face repo id (owner/name, optionally @revision)")
    validate_repo_id(repo_id)  # HFValidationError, a ValueError naming the rule broken
    return repo_id, revision or DEFAULT_REVISION


def list_repo(repo_id: str, revision: str) -> RepoListing:
    """The repo's files with their sizes and hashes, from the hub's API."""
    info = HfApi().model_info(repo_id, revision=revision, files_metadata=True)
    if not info.sha:
        raise ValueError(f"the hub named no commit for {repo_id}@{revision}")
    entries = {}
    for sibling in info.siblings or []:
        _check_relative(sibling.rfilename)
        lfs = sibling.lfs
        entries[sibling.rfilename] = RepoEntry(
            size=lfs.size if lfs else sibling.size,
            sha256=lfs.sha256 if lfs else None,
            git_oid=None if lfs else sibling.blob_id,
        )
    return RepoListing(repo_id, revision, info.sha, entries)


def hub_file(listing: RepoListing, name: str) -> RemoteFile:
    """Where to GET `name` at the listing's commit (a HEAD on its resolve URL, which for LFS
    files redirects to a CDN), refused if the hub's answer contradicts its listing."""
    entry = listing.entries[name]
    url = hf_hub_url(listing.repo_id, name, revision=listing.commit)
    metadata = get_hf_file_metadata(url)
    if entry.sha256 is not None and metadata.etag != entry.sha256:
        raise IntegrityError(f"{listing.repo_id}: {name} is listed with sha256 {entry.sha256} but its "
                             f"download is tagged {metadata.etag}: refusing it")
    if entry.size is not None and metadata.size is not None and entry.size != metadata.size:
        raise IntegrityError(f"{listing.repo_id}: {name} is listed with {entry.size:,} bytes but its "
                             f"download has {metadata.size:,}: refusing it")
    return RemoteFile(name, metadata.location, entry.size if entry.size is not None else metadata.size,
                      sha256=entry.sha256, git_oid=entry.git_oid, headers=_headers(metadata.location))


def url_file(url: str, sha256: str | None = None) -> RemoteFile:
    """A file by URL: its size from a HEAD request, its sha256 from `sha256` or, on a server
    that publishes one the hub's way (X-Linked-Etag), from the server."""
    name = unquote(PurePosixPath(urlsplit(url).path).name)
    metadata = get_hf_file_metadata(url, token=None if _on_hub(url) else False)
    published = metadata.etag if metadata.etag and SHA256.fullmatch(metadata.etag) else None
    if sha256 is not None and published is not None and sha256 != published:
        raise IntegrityError(f"{url} is published with sha256 {published}, not the {sha256} given: refusing it")
    size = metadata.size
    if size is None and metadata.location != url:  # redirected elsewhere: ask there
        size = get_hf_file_metadata(metadata.location, token=False).size
    return RemoteFile(name, metadata.location, size, sha256=sha256 or published, headers=_headers(metadata.location))


def seed_from_hf_cache(listing: RepoListing, name: str, directory: Path) -> bool:
    """Start `name` from huggingface_hub's cache (HF_HOME/hub) when it holds it at this
    commit: a model already downloaded by other tools is not downloaded again. Linked when
    the filesystem allows, else copied; `fetch` checks it like any download."""
    cached = try_to_load_from_cache(listing.repo_id, name, revision=listing.commit)
    part = directory / (name + PART_SUFFIX)
    if not isinstance(cached, str) or (directory / name).exists() or part.exists():
        return False
    part.parent.mkdir(parents=True, exist_ok=True)
    source = os.path.realpath(cached)
    try:
        os.link(source, part)
    except OSError:
        shutil.copyfile(source, part)
    logger.info("%s: starting from the Hugging Face cache (%s)", name, source)
    return True


def fetch(file: RemoteFile, directory: Path, on_bytes: OnBytes | None = None) -> Path:
    """`directory/file.name`, fetched or continued from its `.part`, then checked.

    A file already under its name passed this check before it was renamed, so it is
    returned as it is. A `.part` longer than the file is someone else's bytes and is
    dropped. A failed check removes the `.part` and raises IntegrityError.
    """
    _check_relative(file.name)
    target = directory / file.name
    if target.is_file():
        return target
    part = target.with_name(target.name + PART_SUFFIX)
    part.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.exists() else 0
    if file.size is not None and have > file.size:
        part.unlink()
        have = 0
    if have:
        logger.info("%s: continuing from byte %d", file.name, have)
    if file.size is None or have < file.size:
        with open(part, "ab") as out:
            http_get(file.url, _ReportingFile(out, on_bytes), resume_size=have, headers=dict(file.headers),
                     expected_size=file.size, displayed_filename=file.name)
    verify(part, file)
    os.replace(part, target)
    return target


def verify(path: Path, file: RemoteFile) -> None:
    """Raise IntegrityError (and remove `path`) unless it has `file`'s size and hash."""
    size = path.stat().st_size
    problem = None
    if file.size is not None and size != file.size:
        problem = f"is {size:,} bytes, expected {file.size:,}"
    elif file.sha256 is not None and (got := sha256_of(path)) != file.sha256:
        problem = f"has sha256 {got}, expected {file.sha256}"
    elif file.sha256 is None and file.git_oid is not None and (got := git_oid_of(path)) != file.git_oid:
        problem = f"has git blob id {got}, expected {file.git_oid}"
    if problem is not None:
        path.unlink(missing_ok=True)
        raise IntegrityError(f"{file.name} {problem}: refusing it (the download was removed)")
    if file.sha256 is None and file.git_oid is None:
        logger.warning("%s: the server published no hash; its sha256 is %s", file.name, sha256_of(path))


def git_oid_of(path: Path) -> str:
    """The git blob id of a file: sha1 of "blob SIZE\\0" and the content (what the hub lists
    for files it keeps in git rather than LFS)."""
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as file:
        while chunk := file.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


class _ReportingFile:
    """The `.part` file as `http_get` sees it, telling `on_bytes` how many bytes the file
    holds after each chunk (also right after http_get rewinds it, when a server answers
    a Range request with the whole file)."""

    def __init__(self, file: BinaryIO, on_bytes: OnBytes | None) -> None:
        self._file = file
        self._on_bytes = on_bytes

    def write(self, data: bytes) -> int:
        written = self._file.write(data)
        if self._on_bytes is not None:
            self._on_bytes(self._file.tell())
        return written

    def tell(self) -> int:
        return self._file.tell()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def truncate(self, size: int | None = None) -> int:
        return self._file.truncate(size)


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc.lower()


def _on_hub(url: str) -> bool:
    return _origin(url) == _origin(constants.ENDPOINT)


def _headers(url: str) -> dict[str, str]:
    """The request headers for a GET of `url`: the hub token only for the hub itself,
    never for a CDN's signed URL or another host."""
    return build_hf_headers(token=None if _on_hub(url) else False)


def _check_relative(name: str) -> None:
    """A name from a server must stay inside the directory it is fetched into."""
    path = PurePosixPath(name)
    if not name or path.is_absolute() or ".." in path.parts or "\\" in name:
        raise ValueError(f"refusing a file name that leaves the model directory: {name!r}")
