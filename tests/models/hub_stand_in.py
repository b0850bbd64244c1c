"""A stand-in for the Hugging Face hub on 127.0.0.1: repos in the hub's layout, served on the
endpoints huggingface_hub calls, so that with HF_ENDPOINT pointing here its real download
code runs. What it serves, as the hub does:

- GET /api/models/OWNER/NAME/revision/REV (`?blobs=True`): id, sha (the commit) and the
  siblings with size, blobId and, for LFS files, lfs {sha256, size, pointerSize}
- HEAD|GET /OWNER/NAME/resolve/REV/PATH, with X-Repo-Commit: a file kept in git answers
  200 with ETag = its git blob id; an LFS file redirects (302) to the CDN, another origin
  (http://localhost:PORT), with X-Linked-Etag = its sha256 and X-Linked-Size
- HEAD|GET /cdn/SHA256 and /files/NAME (a plain file URL): the bytes, a Range request
  answered 206 with Content-Range

Faults a test sets: `cut(path, n)` sends n bytes of the next GET of `path` and drops the
connection, then answers 500 to GETs of it until `heal()`; `tamper(sha256, data)` serves
other bytes under a published hash. `bytes_sent` and `ranges` count what went out.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")


def git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Repo:
    commit: str
    files: dict[str, bytes]

    def is_lfs(self, name: str) -> bool:
        return name.endswith(LFS_SUFFIXES)

    def info(self, repo_id: str) -> dict[str, object]:
        siblings = []
        for name, data in sorted(self.files.items()):
            sibling: dict[str, object] = {"rfilename": name, "size": len(data), "blobId": git_oid(data)}
            if self.is_lfs(name):
                sibling["lfs"] = {"sha256": sha256(data), "size": len(data), "pointerSize": 134}
            siblings.append(sibling)
        return {"id": repo_id, "modelId": repo_id, "sha": self.commit, "private": False, "siblings": siblings}


@dataclass
class HubStandIn:
    """The server's state; `endpoint` is what HF_ENDPOINT is set to."""

    port: int = 0
    repos: dict[str, Repo] = field(default_factory=dict)
    plain_files: dict[str, bytes] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)  # sha256 -> bytes the CDN serves
    bytes_sent: Counter[str] = field(default_factory=Counter)  # request path -> body bytes sent
    ranges: list[tuple[str, str]] = field(default_factory=list)  # (path, Range header) of GETs
    cuts: dict[str, int] = field(default_factory=dict)
    refused: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def cdn(self) -> str:
        return f"http://localhost:{self.port}"  # another origin than the endpoint, as a CDN is

    def add_repo(self, repo_id: str, files: dict[str, bytes]) -> Repo:
        commit = hashlib.sha1(repo_id.encode() + b"".join(sorted(files.values()))).hexdigest()
        repo = self.repos[repo_id] = Repo(commit, dict(files))
        for name, data in files.items():
            if repo.is_lfs(name):
                self.blobs.setdefault(sha256(data), data)
        return repo

    def add_file(self, name: str, data: bytes) -> str:
        """A plain file at /files/NAME; returns its URL."""
        self.plain_files[name] = data
        return f"{self.endpoint}/files/{name}"

    def cut(self, path: str, num_bytes: int) -> None:
        self.cuts[path] = num_bytes

    def heal(self) -> None:
        self.refused.clear()

    def tamper(self, digest: str, data: bytes) -> None:
        self.blobs[digest] = data

    def sent(self, path: str) -> int:
        with self.lock:
            return self.bytes_sent[path]


def make_handler(hub: HubStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # keep test output clean
            pass

        def do_HEAD(self) -> None:
            self.route(send_body=False)

        def do_GET(self) -> None:
            self.route(send_body=True)

        def route(self, send_body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) == 6 and parts[4] == "revision":
                return self.repo_info(f"{parts[2]}/{parts[3]}", send_body)
            if len(parts) >= 5 and parts[2] == "resolve":
                return self.resolve(f"{parts[0]}/{parts[1]}", "/".join(parts[4:]), send_body)
            if parts[0] == "cdn" and len(parts) == 2 and parts[1] in hub.blobs:
                return self.body(path, hub.blobs[parts[1]], send_body)
            if parts[0] == "files" and len(parts) == 2 and parts[1] in hub.plain_files:
                return self.body(path, hub.plain_files[parts[1]], send_body, {"ETag": '"plain-1"'})
            self.empty(404, {"X-Error-Code": "EntryNotFound"})

        def repo_info(self, repo_id: str, send_body: bool) -> None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self.empty(404, {"X-Error-Code": "RepoNotFound"})
            data = json.dumps(repo.info(repo_id)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if send_body:
                self.wfile.write(data)

        def resolve(self, repo_id: str, name: str, send_body: bool) -> None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self.empty(404, {"X-Error-Code": "RepoNotFound"})
            if name not in repo.files:
                return self.empty(404, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": repo.commit})
            data = repo.files[name]
            if repo.is_lfs(name):
                digest = sha256(data)
                return self.empty(302, {"Location": f"{hub.cdn}/cdn/{digest}", "X-Repo-Commit": repo.commit,
                                        "X-Linked-Etag": f'"{digest}"', "X-Linked-Size": str(len(data)),
                                        "ETag": f'"{git_oid(data)}"'})
            self.body(urlsplit(self.path).path, data, send_body,
                      {"ETag": f'"{git_oid(data)}"', "X-Repo-Commit": repo.commit})

        def body(self, path: str, data: bytes, send_body: bool, headers: dict[str, str] | None = None) -> None:
            if send_body and path in hub.refused:
                return self.empty(500)
            start = 0
            range_header = self.headers.get("Range")
            if send_body and range_header:
                with hub.lock:
                    hub.ranges.append((path, range_header))
                start = int(range_header.removeprefix("bytes=").split("-")[0])
            chunk = data[start:]
            self.send_response(206 if start else 200)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(len(chunk)))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if not send_body:
                return
            cut = hub.cuts.pop(path, None) if send_body else None
            if cut is not None:
                hub.refused.add(path)
                chunk = chunk[:cut]
                self.close_connection = True
            self.wfile.write(chunk)
            self.wfile.flush()
            with hub.lock:
                hub.bytes_sent[path] += len(chunk)

        def empty(self, status: int, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", "0")
            self.end_headers()

    return Handler


def start(hub: HubStandIn) -> ThreadingHTTPServer:
    """Serve `hub` on a free port of 127.0.0.1 (its `port` is set) in a daemon thread."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(hub))
    server.daemon_threads = True
    hub.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
