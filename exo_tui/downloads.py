"""Model downloads from the Hugging Face hub into its cache, as a generator of progress events.

`files = yield from download(repo)` fetches a repo's files (or only the safetensors holding some
layers) into the normal hub cache, where `engine.models.find_models` finds them, and returns the
snapshot folder. The hub is reached only through huggingface_hub; the environment
(HF_ENDPOINT, HF_HUB_CACHE / HF_HOME, HF_HUB_OFFLINE, HF_TOKEN) is read at each call, not when
huggingface_hub was imported.

Why not plain `snapshot_download`: huggingface_hub 2.x writes each file to a process-unique
`.incomplete` file that it deletes when the download fails, so an interrupted download starts
again from zero, and it never checks a file's hash. Here each file lands in
`blobs/<etag>.incomplete`, kept across runs and resumed with a Range request (huggingface_hub's
own `http_get`), and is moved into place only when its sha256 (LFS files) or git blob id
(the others) matches the hub's metadata; huggingface_hub then links it into the snapshot.
"""
# pyright: strict

from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import shutil
import threading
from collections.abc import Callable, Collection, Generator, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal, cast

import httpx2

# (huggingface_hub types some arguments as bare `dict` / `tqdm`: hence the ignores below.)
from huggingface_hub import (
    HfApi,
    hf_hub_download,  # pyright: ignore[reportUnknownVariableType]
    hf_hub_url,
)
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import http_get  # pyright: ignore[reportUnknownVariableType]
from huggingface_hub.utils import (
    build_hf_headers,  # pyright: ignore[reportUnknownVariableType]
    filter_repo_objects,
)

from engine.errors import EngineError
from engine.models import INDEX_FILE, hf_cache_dir, layer_of, missing_weight_files, shard_files
from engine.types import Frozen

DEFAULT_ENDPOINT = "https://huggingface.co"
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# Attempts at a file whose bytes do not match its hash before giving up.
_FETCH_ATTEMPTS = 2


# --------------------------------------------------------------------------------------------
# Events and errors


class DownloadProgress(Frozen):
    """More bytes of `file` landed: that file's count and the whole download's."""

    type: Literal["download"] = "download"
    repo_id: str
    file: str
    file_bytes: int
    file_total: int
    bytes_done: int
    total: int
    files_done: int
    files_total: int


Downloading = Generator[DownloadProgress, None, Path]


class DownloadError(EngineError):
    pass


class HubOfflineError(DownloadError):
    """Offline (HF_HUB_OFFLINE) or the endpoint cannot be reached, and the cache lacks the model."""


class RepoGatedError(DownloadError):
    pass


class RepoNotFoundError(DownloadError):
    pass


class DiskSpaceError(DownloadError):
    pass


class IntegrityError(DownloadError):
    pass


class DownloadCancelled(DownloadError):
    pass


# --------------------------------------------------------------------------------------------
# Where and how to reach the hub


def _is_true(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


@dataclass(frozen=True)
class HubSettings:
    """The hub endpoint, the cache folder and offline mode, as the environment says now."""

    endpoint: str
    cache_dir: Path
    offline: bool

    @classmethod
    def from_env(cls) -> HubSettings:
        endpoint = os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
        offline = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
        return cls(endpoint.rstrip("/"), hf_cache_dir(), _is_true(offline))

    def storage(self, repo_id: str) -> Path:
        """The cache's folder for a model repo: blobs/, refs/ and snapshots/ live in it."""
        return self.cache_dir / ("models--" + repo_id.replace("/", "--"))


class RemoteFile(Frozen):
    """A file of a repo at one commit, as the hub describes it."""

    name: str
    size: int
    sha256: str | None = None  # LFS files
    blob_id: str | None = None  # the git object id

    @property
    def etag(self) -> str:
        """The hub's ETag for it, which names its blob in the cache."""
        etag = self.sha256 or self.blob_id
        if etag is None:
            raise DownloadError(f"The hub gave no hash for {self.name}", "Try again later")
        return etag


class RepoSnapshot(Frozen):
    repo_id: str
    revision: str
    commit: str
    files: tuple[RemoteFile, ...]


# --------------------------------------------------------------------------------------------
# Which files


def _index_layers(index_json: Mapping[str, Any]) -> int:
    weight_map = cast(dict[str, object], index_json.get("weight_map") or {})
    layers = [layer for w in weight_map if (layer := layer_of(w)) is not None]
    return max(layers, default=-1) + 1


# --------------------------------------------------------------------------------------------
# Integrity: a file is in place only when its size and hash match the hub's


def _git_blob_id(path: Path, size: int) -> str:
    digest = hashlib.sha1(f"blob {size}\0".encode(), usedforsecurity=False)
    _hash_into(digest, path)
    return digest.hexdigest()


def _hash_into(digest: Any, path: Path) -> None:
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)


def _marker(storage: Path, file: RemoteFile) -> Path:
    return storage / ".exo-tui-verified" / file.etag


def _stamp(path: Path) -> str:
    stat = path.stat()
    return f"{stat.st_size}:{stat.st_mtime_ns}"


def _matches(path: Path, file: RemoteFile, storage: Path) -> bool:
    """Size and hash against the hub's; a hash checked once is remembered until the file changes."""
    if path.stat().st_size != file.size:
        return False
    marker = _marker(storage, file)
    try:
        if marker.read_text() == _stamp(path):
            return True
    except OSError:
        pass
    if file.sha256 is not None and _SHA256.fullmatch(file.sha256):
        digest = hashlib.sha256()
        _hash_into(digest, path)
        ok = digest.hexdigest() == file.sha256
    elif file.blob_id is not None:
        ok = _git_blob_id(path, file.size) == file.blob_id
    else:
        ok = True  # nothing to compare with but the size
    if ok:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(_stamp(path))
    return ok


# --------------------------------------------------------------------------------------------
# Asking the hub


def _hub_error(error: Exception, repo_id: str, revision: str, settings: HubSettings) -> Exception:
    """huggingface_hub's exception as a DownloadError that says what to do."""
    page = f"{settings.endpoint}/{repo_id}"
    if isinstance(error, GatedRepoError):
        return RepoGatedError(
            f"{repo_id} is gated: the hub refused access ({_status(error)})",
            f"Accept its terms at {page} and set HF_TOKEN to a token of that account",
        )
    if isinstance(error, RevisionNotFoundError):
        return RepoNotFoundError(
            f"{repo_id} has no revision '{revision}' on {settings.endpoint}",
            "Use an existing branch, tag or commit (default: main)",
        )
    if isinstance(error, RepositoryNotFoundError):
        return RepoNotFoundError(
            f"No model repo {repo_id} on {settings.endpoint} ({_status(error)})",
            "Check the name (`exo-tui models` lists the catalogue); "
            "for a private repo set HF_TOKEN",
        )
    if isinstance(error, OfflineModeIsEnabled | httpx2.TransportError):
        return HubOfflineError(
            f"Cannot reach the hub at {settings.endpoint} ({type(error).__name__}: {error})",
            "Check the network (or HF_ENDPOINT) and run again; finished and partial files are kept",
        )
    if isinstance(error, HfHubHTTPError):
        return DownloadError(
            f"The hub at {settings.endpoint} answered {_status(error)} for {repo_id}",
            "Try again later",
        )
    return error


def _status(error: HfHubHTTPError) -> str:
    response = cast(Any, error).response
    return f"HTTP {response.status_code}" if response is not None else "no answer"


def repo_snapshot(repo_id: str, revision: str, settings: HubSettings) -> RepoSnapshot:
    """The repo's commit for `revision` and its files with sizes and hashes (one API call)."""
    api = HfApi(endpoint=settings.endpoint)
    try:
        info = api.model_info(repo_id, revision=revision, files_metadata=True)
    except (HfHubHTTPError, OfflineModeIsEnabled, httpx2.TransportError) as error:
        raise _hub_error(error, repo_id, revision, settings) from error
    if info.sha is None:
        raise DownloadError(f"The hub gave no commit for {repo_id}", "Try again later")
    files = tuple(
        RemoteFile(
            name=s.rfilename,
            size=s.lfs.size if s.lfs is not None else (s.size or 0),
            sha256=s.lfs.sha256 if s.lfs is not None else None,
            blob_id=s.blob_id,
        )
        for s in info.siblings or ()
    )
    return RepoSnapshot(repo_id=repo_id, revision=revision, commit=info.sha, files=files)


# --------------------------------------------------------------------------------------------
# Fetching one file


class _Stopped(Exception):
    """Raised from the progress hook to abandon a file: the download was cancelled."""


class _ProgressHook:
    """Stands in for tqdm inside huggingface_hub's `http_get`: counts bytes, honours a cancel."""

    def __init__(self, report: Callable[[int], None], *, initial: int = 0, **_: object) -> None:
        self._report = report
        self._bytes = initial

    def __enter__(self) -> _ProgressHook:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def close(self) -> None:
        return None

    def update(self, n: float | None = 1) -> None:
        self._bytes += int(n or 0)
        self._report(self._bytes)


@dataclass(frozen=True)
class _FileJob:
    snapshot: RepoSnapshot
    file: RemoteFile
    settings: HubSettings

    @property
    def storage(self) -> Path:
        return self.settings.storage(self.snapshot.repo_id)

    @property
    def blob(self) -> Path:
        return self.storage / "blobs" / self.file.etag

    @property
    def pointer(self) -> Path:
        return self.storage / "snapshots" / self.snapshot.commit / self.file.name

    @property
    def partial(self) -> Path:
        return self.storage / "blobs" / f"{self.file.etag}.incomplete"

    def stored(self) -> Path | None:
        """The file's bytes in the cache: its blob, or the snapshot file when links are off."""
        if self.blob.is_file():
            return self.blob
        if self.pointer.is_file() and not self.pointer.is_symlink():
            return self.pointer
        return None

    def bytes_present(self) -> int:
        stored = self.stored()
        if stored is not None and stored.stat().st_size == self.file.size:
            return self.file.size
        if self.partial.is_file():
            return min(self.partial.stat().st_size, self.file.size)
        return 0


def _fetch_file(job: _FileJob, report: Callable[[int], None]) -> Path:
    """Make one file present and verified in the cache; returns its snapshot path."""
    stored = job.stored()
    if stored is not None:
        if _matches(stored, job.file, job.storage):
            report(job.file.size)
            return _link(job)
        stored.unlink()  # wrong size or hash: fetch it again rather than load it
        job.pointer.unlink(missing_ok=True)
    for attempt in range(1, _FETCH_ATTEMPTS + 1):
        try:
            _resume_into_partial(job, report)
        except BaseException:
            if job.partial.is_file() and job.partial.stat().st_size == 0:
                job.partial.unlink()  # nothing to resume
            raise
        if _matches(job.partial, job.file, job.storage):
            break
        job.partial.unlink()
        if attempt == _FETCH_ATTEMPTS:
            raise IntegrityError(
                f"{job.file.name} of {job.snapshot.repo_id} came down {_FETCH_ATTEMPTS} times "
                "with bytes that do not match the hub's hash",
                "Try again later; if it persists the hub or a proxy on the way serves a bad copy",
            )
    stamp = _stamp(job.partial)
    os.replace(job.partial, job.blob)
    _marker(job.storage, job.file).write_text(stamp)  # a rename keeps size and mtime
    return _link(job)


def _resume_into_partial(job: _FileJob, report: Callable[[int], None]) -> None:
    """Download into `<etag>.incomplete`, continuing from what an earlier run left there."""
    job.partial.parent.mkdir(parents=True, exist_ok=True)
    resume = job.partial.stat().st_size if job.partial.is_file() else 0
    if resume > job.file.size:
        resume = 0
    report(resume)  # what an earlier run left counts at once; raises if already cancelled
    url = hf_hub_url(
        job.snapshot.repo_id, job.file.name, revision=job.snapshot.commit,
        endpoint=job.settings.endpoint,
    )  # fmt: skip
    with job.partial.open("r+b" if resume else "wb") as out:
        out.truncate(resume)
        out.seek(resume)
        if resume == job.file.size:
            return
        http_get(
            url,
            out,
            resume_size=resume,
            headers=build_hf_headers(),
            expected_size=job.file.size,
            displayed_filename=job.file.name,
            # huggingface_hub builds its bar with `tqdm_class(total=, initial=, ...)`.
            tqdm_class=cast(Any, partial(_ProgressHook, report)),
        )


def _link(job: _FileJob) -> Path:
    """huggingface_hub links the verified blob into the snapshot (it finds the blob in place)."""
    path = hf_hub_download(
        job.snapshot.repo_id,
        job.file.name,
        revision=job.snapshot.commit,
        cache_dir=job.settings.cache_dir,
        endpoint=job.settings.endpoint,
    )
    return Path(path)


# --------------------------------------------------------------------------------------------
# The whole download


@dataclass
class _Landed:
    file: str
    file_bytes: int


@dataclass
class _Finished:
    file: str
    error: BaseException | None


def download(
    repo_id: str,
    *,
    allow_patterns: Sequence[str] | str | None = None,
    revision: str = "main",
    layers: tuple[int, int] | None = None,
    total_layers: int | None = None,
    cancel: threading.Event | None = None,
    max_workers: int = 4,
) -> Downloading:
    """Download a model repo: `snapshot = yield from download(repo)`.

    `layers=(start, end)` fetches only the safetensors holding those layers (and the weights
    outside layers) plus every other file; `allow_patterns` narrows the files further. Offline
    (HF_HUB_OFFLINE, or the endpoint unreachable) the cached snapshot is returned when it holds
    what was asked for. Setting `cancel` stops the download (DownloadCancelled); partial files
    are kept, and the next call resumes them.
    """
    settings = HubSettings.from_env()
    if settings.offline:
        reason = HubOfflineError(
            f"HF_HUB_OFFLINE is set and {repo_id} is not in the Hugging Face cache "
            f"({settings.cache_dir})",
            "Unset HF_HUB_OFFLINE to download it, or copy the cache from a machine that has it",
        )
        return cached_snapshot(repo_id, revision, settings, layers, reason)
    try:
        snapshot = repo_snapshot(repo_id, revision, settings)
    except HubOfflineError as error:
        return cached_snapshot(repo_id, revision, settings, layers, error)

    files = _select(snapshot, settings, allow_patterns, layers, total_layers)
    jobs = [_FileJob(snapshot, f, settings) for f in files]
    check_disk_space(repo_id, jobs, settings.cache_dir)
    yield from _run_jobs(jobs, cancel, max_workers)
    _write_ref(settings.storage(repo_id), revision, snapshot.commit)
    return settings.storage(repo_id) / "snapshots" / snapshot.commit


def _select(
    snapshot: RepoSnapshot,
    settings: HubSettings,
    allow_patterns: Sequence[str] | str | None,
    layers: tuple[int, int] | None,
    total_layers: int | None,
) -> list[RemoteFile]:
    files = list(
        filter_repo_objects(
            snapshot.files,
            allow_patterns=list(allow_patterns) if isinstance(allow_patterns, Sequence)
            and not isinstance(allow_patterns, str) else allow_patterns,
            key=lambda f: f.name,
        )
    )  # fmt: skip
    if layers is None:
        return files
    if total_layers is not None and not 0 <= layers[0] < layers[1] <= total_layers:
        raise ValueError(f"layers {layers[0]}:{layers[1]} are not within 0:{total_layers}")
    index = next((f for f in snapshot.files if f.name == INDEX_FILE), None)
    if index is None:
        return files  # one safetensors file holds every layer
    index_path = _fetch_file(_FileJob(snapshot, index, settings), lambda _: None)
    index_json = cast(dict[str, Any], json.loads(Path(index_path).read_text(encoding="utf-8")))
    in_index = _index_layers(index_json)
    if total_layers is not None and in_index != total_layers:
        raise DownloadError(
            f"{snapshot.repo_id}'s {INDEX_FILE} holds {in_index} layers, not {total_layers}",
            "Place the model again from its own card",
        )
    wanted = shard_files(index_json, layers)
    return [f for f in files if not f.name.endswith(".safetensors") or f.name in wanted]


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_disk_space(repo_id: str, jobs: Iterable[_FileJob], cache_dir: Path) -> None:
    """Refuse to start when the bytes still to fetch exceed the free space of the cache's disk."""
    needed = sum(job.file.size - job.bytes_present() for job in jobs)
    where = _existing_parent(cache_dir)
    free = shutil.disk_usage(where).free
    if needed > free:
        raise DiskSpaceError(
            f"{repo_id} needs {_gb(needed)} more, but {where} has {_gb(free)} free",
            "Free some space, or point HF_HUB_CACHE (or HF_HOME) at a larger disk",
        )


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 10**8 else f"{n / 1e6:.1f} MB"


def _run_jobs(
    jobs: Collection[_FileJob], cancel: threading.Event | None, max_workers: int
) -> Generator[DownloadProgress]:
    """Fetch files on a few threads; their byte counts come back through one queue."""
    if not jobs:
        return
    first_job = next(iter(jobs))
    repo_id, settings = first_job.snapshot.repo_id, first_job.settings
    sizes = {job.file.name: job.file.size for job in jobs}
    landed = dict.fromkeys(sizes, 0)
    total = sum(sizes.values())
    events: queue.Queue[_Landed | _Finished] = queue.Queue()
    stop = threading.Event()

    def report(name: str, file_bytes: int) -> None:
        if stop.is_set() or (cancel is not None and cancel.is_set()):
            raise _Stopped
        events.put(_Landed(name, file_bytes))

    def run(job: _FileJob) -> None:
        try:
            _fetch_file(job, partial(report, job.file.name))
            events.put(_Finished(job.file.name, None))
        except BaseException as error:  # handed to the consuming thread, which raises it
            events.put(_Finished(job.file.name, error))

    first_error: BaseException | None = None
    files_done = 0
    with ThreadPoolExecutor(max_workers=max(1, max_workers)) as pool:
        try:
            for job in jobs:
                pool.submit(run, job)
            pending = len(jobs)  # each job ends with exactly one _Finished
            while pending:
                event = events.get()
                if isinstance(event, _Finished):
                    pending -= 1
                    if event.error is not None:
                        first_error = first_error or event.error
                        stop.set()
                        continue
                    files_done += 1
                    landed[event.file] = sizes[event.file]
                else:
                    landed[event.file] = event.file_bytes
                if first_error is None:
                    yield DownloadProgress(
                        repo_id=repo_id,
                        file=event.file,
                        file_bytes=landed[event.file],
                        file_total=sizes[event.file],
                        bytes_done=sum(landed.values()),
                        total=total,
                        files_done=files_done,
                        files_total=len(jobs),
                    )
        finally:
            stop.set()  # also when the consumer closes the generator: the threads give up
    if first_error is not None:
        raise _as_download_error(first_error, repo_id, settings, cancel)


def _as_download_error(
    error: BaseException, repo_id: str, settings: HubSettings, cancel: threading.Event | None
) -> BaseException:
    if isinstance(error, _Stopped):
        if cancel is not None and cancel.is_set():
            return DownloadCancelled(
                f"The download of {repo_id} was cancelled",
                "Run it again to resume: finished and partial files are kept",
            )
        return DownloadError(f"The download of {repo_id} stopped", "Run it again to resume")
    if isinstance(error, EngineError):
        return error
    mapped = _hub_error(cast(Exception, error), repo_id, "", settings)
    if mapped is not error:
        return mapped
    if isinstance(error, OSError):
        return DownloadError(
            f"The download of {repo_id} failed: {error}",
            "Check the disk and the network, then run again to resume",
        )
    return error


def _write_ref(storage: Path, revision: str, commit: str) -> None:
    """Record which commit a branch or tag named, as huggingface_hub does (refs/<revision>)."""
    if revision == commit:
        return
    ref = storage / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    if ref.is_file() and ref.read_text() == commit:
        return
    tmp = ref.with_name(f".{ref.name}.tmp")
    tmp.write_text(commit)
    os.replace(tmp, ref)


# --------------------------------------------------------------------------------------------
# Offline: the cache alone


def cached_snapshot(
    repo_id: str,
    revision: str,
    settings: HubSettings,
    layers: tuple[int, int] | None,
    why_not_online: HubOfflineError,
) -> Path:
    """The cached snapshot of `revision` when it holds the weights asked for; else the error."""
    storage = settings.storage(repo_id)
    commit: str | None = revision if _COMMIT.fullmatch(revision) else None
    ref = storage / "refs" / revision
    if commit is None and ref.is_file():
        commit = ref.read_text().strip()
    snapshot = storage / "snapshots" / (commit or "-")
    if commit is None or not (snapshot / "config.json").is_file():
        raise why_not_online
    missing = missing_weight_files(snapshot, layers)
    if not missing and not any(snapshot.glob("*.safetensors")):
        missing = ["model.safetensors"]
    if missing:
        raise HubOfflineError(
            f"{why_not_online.cause}; the cache holds only part of {repo_id} "
            f"({len(missing)} weight files missing, e.g. {missing[0]})",
            why_not_online.fix,
        )
    return snapshot
