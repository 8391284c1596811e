"""A stand-in for the Hugging Face hub on 127.0.0.1, serving model folders the way the hub does.

It answers what huggingface_hub asks: `GET /api/models/{repo}/revision/{rev}` (the commit and
the files with sizes, blob ids and LFS sha256), `HEAD` / `GET /{repo}/resolve/{rev}/{file}`
(ETag, X-Repo-Commit, Content-Length; LFS files answer 302 to a "CDN" URL with X-Linked-Etag and
X-Linked-Size) and Range requests with 206. It can be told to fail a repo (404 missing, 401 or
403 gated), to cut a file off midway, or to serve corrupt bytes, and it counts the body bytes it
sends per file.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Literal, Self
from urllib.parse import unquote, urlsplit

import huggingface_hub.constants as hf_constants
import pytest

RepoStatus = Literal["ok", "missing", "gated"]

_API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/revision/(?P<rev>[^/]+)$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_CDN = re.compile(r"^/cdn/(?P<sha>[0-9a-f]{64})$")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class HubRepo:
    repo_id: str
    files: dict[str, bytes]
    commit: str
    status: RepoStatus = "ok"
    gated_status: int = 401

    def is_lfs(self, name: str) -> bool:
        return name.endswith(".safetensors")

    def sha256(self, name: str) -> str:
        return hashlib.sha256(self.files[name]).hexdigest()


@dataclass
class Served:
    """One request that reached a file: which, from which byte, and how many body bytes went."""

    method: str
    file: str
    start: int
    sent: int
    status: int


@dataclass
class _Faults:
    cut_after: dict[str, int] = field(default_factory=dict[str, int])
    corrupt: Counter[str] = field(default_factory=Counter[str])
    held: dict[str, threading.Event] = field(default_factory=dict[str, threading.Event])


class HubServer:
    """`with HubServer() as hub: hub.add_repo("org/name", folder)`; HF_ENDPOINT=hub.endpoint."""

    def __init__(self) -> None:
        self.repos: dict[str, HubRepo] = {}
        self.served: list[Served] = []
        self.api_calls = 0
        self._faults = _Faults()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def add_repo(self, repo_id: str, folder: Path, status: RepoStatus = "ok") -> HubRepo:
        files = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
        commit = hashlib.sha1(repo_id.encode() + b"".join(files.values())).hexdigest()
        repo = HubRepo(repo_id, files, commit, status)
        self.repos[repo_id] = repo
        return repo

    def cut_next(self, file: str, after: int) -> None:
        """The next GET of `file` sends `after` body bytes, then the connection drops."""
        self._faults.cut_after[file] = after

    def corrupt_next(self, file: str, times: int = 1) -> None:
        """The next `times` GETs of `file` send bytes of the right length but the wrong content."""
        self._faults.corrupt[file] = times

    def hold(self, file: str) -> threading.Event:
        """GETs of `file` wait (after the headers) until the returned event is set."""
        release = self._faults.held[file] = threading.Event()
        return release

    def bytes_served(self, file: str | None = None) -> int:
        with self._lock:
            return sum(s.sent for s in self.served if file is None or s.file == file)

    def reset_counts(self) -> None:
        with self._lock:
            self.served.clear()
            self.api_calls = 0

    # -- what a hostile hub (tests/hostile_hub.py) changes in its answers

    def model_info(self, repo: HubRepo, info: dict[str, object]) -> dict[str, object]:
        """The JSON that `GET /api/models/{repo}/revision/{rev}` answers."""
        return info

    def file_headers(self, repo: HubRepo, name: str, headers: dict[str, str]) -> dict[str, str]:
        """The headers of an answer about `name` (HEAD or GET, a redirect or the bytes)."""
        return headers

    # -- what the handler asks

    def _record(self, served: Served) -> None:
        with self._lock:
            self.served.append(served)

    def _take_cut(self, file: str) -> int | None:
        with self._lock:
            return self._faults.cut_after.pop(file, None)

    def _take_corrupt(self, file: str) -> bool:
        with self._lock:
            if self._faults.corrupt[file] > 0:
                self._faults.corrupt[file] -= 1
                return True
            return False

    def _find(self, sha: str) -> tuple[HubRepo, str] | None:
        for repo in self.repos.values():
            for name in repo.files:
                if repo.is_lfs(name) and repo.sha256(name) == sha:
                    return repo, name
        return None


def _handler_for(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            return None  # quiet tests

        def do_HEAD(self) -> None:
            self._route(body=False)

        def do_GET(self) -> None:
            self._route(body=True)

        def _route(self, *, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            if match := _API.match(path):
                self._api(match["repo"], match["rev"])
            elif match := _RESOLVE.match(path):
                self._resolve(match["repo"], match["rev"], match["file"], body=body)
            elif match := _CDN.match(path):
                found = hub._find(match["sha"])
                if found is None:
                    self._error(404, "EntryNotFound")
                else:
                    repo, name = found
                    self._send_file(repo, name, body=body, etag=repo.sha256(name))
            else:
                self._error(404, None)

        def _repo(self, repo_id: str, revision: str) -> HubRepo | None:
            repo = hub.repos.get(repo_id)
            if repo is None or repo.status == "missing":
                self._error(404, "RepoNotFound", "Repository not found")
                return None
            if repo.status == "gated":
                message = f"Access to model {repo_id} is restricted. You must be authenticated."
                self._error(repo.gated_status, "GatedRepo", message)
                return None
            if revision not in ("main", repo.commit):
                self._error(404, "RevisionNotFound", "Invalid rev id")
                return None
            return repo

        def _api(self, repo_id: str, revision: str) -> None:
            with hub._lock:
                hub.api_calls += 1
            repo = self._repo(repo_id, revision)
            if repo is None:
                return
            siblings: list[dict[str, object]] = []
            for name, data in repo.files.items():
                sibling: dict[str, object] = {
                    "rfilename": name,
                    "size": len(data),
                    "blobId": git_blob_id(data),
                }
                if repo.is_lfs(name):
                    pointer = f"oid sha256:{repo.sha256(name)}\nsize {len(data)}\n"
                    sibling["blobId"] = git_blob_id(pointer.encode())
                    sibling["size"] = len(pointer)
                    sibling["lfs"] = {
                        "size": len(data),
                        "sha256": repo.sha256(name),
                        "pointerSize": len(pointer),
                    }
                siblings.append(sibling)
            info = {"id": repo_id, "modelId": repo_id, "sha": repo.commit, "private": False,
                    "gated": False, "siblings": siblings}  # fmt: skip
            payload = json.dumps(hub.model_info(repo, info)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _resolve(self, repo_id: str, revision: str, name: str, *, body: bool) -> None:
            repo = self._repo(repo_id, revision)
            if repo is None:
                return
            if name not in repo.files:
                self._error(404, "EntryNotFound", "Entry not found", commit=repo.commit)
                return
            if repo.is_lfs(name):
                # The hub sends LFS files from a CDN: a redirect that names the blob and its size.
                sha = repo.sha256(name)
                self.send_response(302)
                self._send_headers(repo, name, {
                    "Location": f"{hub.endpoint}/cdn/{sha}",
                    "X-Repo-Commit": repo.commit,
                    "X-Linked-Etag": f'"{sha}"',
                    "X-Linked-Size": str(len(repo.files[name])),
                    "ETag": f'"{git_blob_id(b"pointer")}"',
                    "Content-Length": "0",
                })  # fmt: skip
                return
            self._send_file(repo, name, body=body, etag=git_blob_id(repo.files[name]))

        def _send_file(self, repo: HubRepo, name: str, *, body: bool, etag: str) -> None:
            data = repo.files[name]
            start = 0
            range_header = self.headers.get("Range")
            match = _RANGE.match(range_header or "")
            if match:
                start = int(match[1])
                end = int(match[2]) + 1 if match[2] else len(data)
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.end_headers()
                    return
                chunk = data[start:end]
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
            else:
                chunk = data
                self.send_response(200)
            self._send_headers(repo, name, {
                "Content-Length": str(len(chunk)),
                "ETag": f'"{etag}"',
                "X-Repo-Commit": repo.commit,
                "Accept-Ranges": "bytes",
            })  # fmt: skip
            if not body:
                hub._record(Served("HEAD", name, start, 0, 200))
                return
            held = hub._faults.held.get(name)
            if held is not None:
                held.wait(timeout=120)
            if hub._take_corrupt(name):
                chunk = bytes(b ^ 0xFF for b in chunk)
            cut = hub._take_cut(name)
            if cut is not None and cut < len(chunk):
                self.wfile.write(chunk[:cut])
                self.wfile.flush()
                hub._record(Served("GET", name, start, cut, 206 if match else 200))
                self.close_connection = True
                self.connection.shutdown(2)  # the peer sees the body end early
                return
            self.wfile.write(chunk)
            hub._record(Served("GET", name, start, len(chunk), 206 if match else 200))

        def _send_headers(self, repo: HubRepo, name: str, headers: dict[str, str]) -> None:
            for key, value in hub.file_headers(repo, name, headers).items():
                self.send_header(key, value)
            self.end_headers()

        def _error(
            self, status: int, code: str | None, message: str = "", commit: str | None = None
        ) -> None:
            payload = json.dumps({"error": message or "not found"}).encode()
            self.send_response(status)
            if code:
                self.send_header("X-Error-Code", code)
            if message:
                self.send_header("X-Error-Message", message)
            if commit:
                self.send_header("X-Repo-Commit", commit)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

    return Handler


def use_hub(
    monkeypatch: pytest.MonkeyPatch, server: HubServer, hf_home: Path, cache: Path | None = None
) -> None:
    """Downloads in this process go to `server`, into `hf_home` (and `cache`, when given: the
    hub cache). exo_tui.hub.downloads reads these at each call, so setting them here is enough.
    Small chunks: a tiny file lands in many progress steps and can be cut midway."""
    monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    if cache is not None:
        monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(hf_constants, "DOWNLOAD_CHUNK_SIZE", 4096)
