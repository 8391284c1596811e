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
(the others) matches the hub's metadata; huggingface_hub's own helper then links it into the
snapshot. Not `hf_hub_download` for that either: it takes each file's ETag and commit from the
hub's headers as paths in the cache, so a hostile mirror could write outside it. Every name the
hub sends is checked (exo_tui.hub.names) before it becomes a path, and every path written is
resolved and must lie in the repo's cache folder.
"""
# pyright: strict

from __future__ import annotations

import hashlib
import os
import queue
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
from huggingface_hub import HfApi, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

# The cache's own way to link a snapshot file to its blob (a relative symlink, or a copy where
# links are off): private, but the one huggingface_hub uses, so the layout stays its own.
from huggingface_hub.file_download import (
    _create_symlink,  # pyright: ignore[reportPrivateUsage]
    http_get,  # pyright: ignore[reportUnknownVariableType]
)
from huggingface_hub.hf_api import RepoSibling
from huggingface_hub.utils import (
    build_hf_headers,  # pyright: ignore[reportUnknownVariableType]
    filter_repo_objects,
    validate_repo_id,
)
from pydantic import Field, ValidationError
from pydantic_core import ErrorDetails

from engine.errors import EngineError, ModelFormatError
from engine.models import (
    INDEX_FILE,
    hf_cache_dir,
    layer_of,
    missing_weight_files,
    shard_files,
    weight_index,
)
from engine.types import Frozen
from exo_tui.hub.names import GitHash, RepoFileName, Sha256, check_hash, relative_path_problem

DEFAULT_ENDPOINT = "https://huggingface.co"
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


class HubAnswerError(DownloadError):
    """The hub's answer about a repo cannot be used: a hash or name in it is not one."""

    def __init__(self, settings: HubSettings, repo_id: str, detail: str) -> None:
        super().__init__(
            f"The hub at {settings.endpoint} sent an unusable answer about {repo_id}: {detail}",
            "Nothing of it was written. A broken or hostile mirror answers so: unset HF_ENDPOINT "
            f"(the default is {DEFAULT_ENDPOINT}) or point it at a mirror you trust",
        )


class OutsideCacheError(DownloadError):
    """A path to be written resolves outside the repo's cache folder (a link points out)."""


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
    """A file of a repo at one commit, as the hub describes it: each name checked, as each
    becomes part of a path."""

    name: RepoFileName
    size: int = Field(ge=0, strict=True)
    sha256: Sha256 | None = None  # LFS files
    blob_id: GitHash | None = None  # the git object id

    @property
    def etag(self) -> str:
        """The hub's ETag for it, which names its blob in the cache."""
        etag = self.sha256 or self.blob_id
        assert etag is not None, "repo_snapshot admits no file without a hash"
        return etag


class RepoSnapshot(Frozen):
    repo_id: str
    revision: str
    commit: GitHash
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


def _stamp(path: Path) -> str:
    stat = path.stat()
    return f"{stat.st_size}:{stat.st_mtime_ns}"


def _digest(path: Path, file: RemoteFile) -> str:
    """The hash of `path` that the hub's hash of `file` is: sha256 (LFS) or the git blob id."""
    if file.sha256 is not None:
        digest = hashlib.sha256()
        _hash_into(digest, path)
        return digest.hexdigest()
    return _git_blob_id(path, file.size)


def _matches(path: Path, job: _FileJob) -> bool:
    """Size and hash against the hub's; a hash checked once is remembered until the file changes."""
    if path.stat().st_size != job.file.size:
        return False
    marker = job.marker
    try:
        if marker.read_text() == _stamp(path):
            return True
    except OSError:
        pass
    ok = _digest(path, job.file) == job.file.etag
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
    """The repo's commit for `revision` and its files with sizes and hashes (one API call).

    Raises HubAnswerError, naming the field, when a hash or a name in the answer is not one."""
    api = HfApi(endpoint=settings.endpoint)
    try:
        info = api.model_info(repo_id, revision=revision, files_metadata=True)
    except (HfHubHTTPError, OfflineModeIsEnabled, httpx2.TransportError) as error:
        raise _hub_error(error, repo_id, revision, settings) from error
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        # huggingface_hub reads the JSON into its ModelInfo as it comes
        detail = f"not a model info ({type(error).__name__}: {error})"
        raise HubAnswerError(settings, repo_id, detail) from error
    commit = _as_commit(info.sha)
    if commit is None:
        detail = f"sha {info.sha!r} is not a commit hash (40 or 64 hex characters)"
        raise HubAnswerError(settings, repo_id, detail)
    files: dict[str, RemoteFile] = {}
    for number, sibling in enumerate(info.siblings or ()):
        file = _remote_file(number, sibling, settings, repo_id)
        if file.name in files:
            detail = f"siblings[{number}].rfilename {file.name!r} lists a file twice"
            raise HubAnswerError(settings, repo_id, detail)
        files[file.name] = file
    return RepoSnapshot(
        repo_id=repo_id, revision=revision, commit=commit, files=tuple(files.values())
    )


def _as_commit(sha: object) -> str | None:
    """`sha` when it is a commit hash (in lower case), else None."""
    if not isinstance(sha, str):
        return None
    try:
        return check_hash(sha)
    except ValueError:
        return None


def _remote_file(
    number: int, sibling: RepoSibling, settings: HubSettings, repo_id: str
) -> RemoteFile:
    """One entry of the hub's file list as a RemoteFile; HubAnswerError names a bad field."""
    lfs = sibling.lfs
    values: dict[str, object] = {
        "name": sibling.rfilename,
        "size": lfs.size if lfs is not None else sibling.size,
        "sha256": lfs.sha256 if lfs is not None else None,
        "blob_id": sibling.blob_id,
    }
    hub_field = {"name": "rfilename", "size": "lfs.size" if lfs is not None else "size",
                 "sha256": "lfs.sha256", "blob_id": "blobId"}  # fmt: skip
    try:
        file = RemoteFile.model_validate(values)
    except ValidationError as error:
        first = error.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "name"
        detail = f"siblings[{number}].{hub_field[field]} {values[field]!r} {_reason(first)}"
        raise HubAnswerError(settings, repo_id, detail) from error
    if file.sha256 is None and file.blob_id is None:
        detail = f"siblings[{number}] ({file.name}) gives no hash to check it by (blobId)"
        raise HubAnswerError(settings, repo_id, detail)
    return file


def _reason(error: ErrorDetails) -> str:
    """pydantic's complaint, or the one our validator raised (hub_names says why a name is bad)."""
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, ValueError):
        return str(cause)
    return error["msg"][:1].lower() + error["msg"][1:]


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

    # The paths this job writes, each checked to stay in the repo's folder. Those it replaces
    # or links are checked up to their folder; those it writes into, through the file itself.

    @property
    def blob(self) -> Path:
        return inside_storage(self.storage, self.storage / "blobs" / self.file.etag)

    @property
    def pointer(self) -> Path:
        pointer = self.storage / "snapshots" / self.snapshot.commit / self.file.name
        return inside_storage(self.storage, pointer)

    @property
    def partial(self) -> Path:
        partial = self.storage / "blobs" / f"{self.file.etag}.incomplete"
        return inside_storage(self.storage, partial, through_link=True)

    @property
    def marker(self) -> Path:
        """Its verified-marker: the size and mtime its blob had when its hash matched."""
        marker = self.storage / ".exo-tui-verified" / self.file.etag
        return inside_storage(self.storage, marker, through_link=True)

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


def inside_storage(storage: Path, path: Path, *, through_link: bool = False) -> Path:
    """`path`, once it is sure to resolve inside `storage` (the repo's cache folder): its folder,
    or with `through_link` the path itself, since writing into a link writes where it points."""
    resolved = path.resolve() if through_link else path.parent.resolve() / path.name
    root = storage.resolve()
    if not resolved.is_relative_to(root):
        raise OutsideCacheError(
            f"{path} resolves to {resolved}, outside the cache's folder {root}: "
            "a link inside it points out",
            "Remove that link; to keep the cache on another disk, point HF_HUB_CACHE there",
        )
    return path


def _fetch_file(job: _FileJob, report: Callable[[int], None]) -> Path:
    """Make one file present and verified in the cache; returns its snapshot path."""
    stored = job.stored()
    if stored is not None:
        if _matches(stored, job):
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
        if _matches(job.partial, job):
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
    job.marker.write_text(stamp)  # a rename keeps size and mtime
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
    """Link the verified blob into the snapshot as huggingface_hub does (no request: a link to
    the blob, or the file itself where links are off, stays as it is)."""
    pointer, blob = job.pointer, job.blob
    if pointer.is_symlink() and pointer.resolve() == blob.resolve():
        return pointer
    if not pointer.is_symlink() and pointer.is_file():
        return pointer  # links are off: _fetch_file checked this copy (or its blob) already
    pointer.parent.mkdir(parents=True, exist_ok=True)
    _create_symlink(str(blob), str(pointer), new_blob=False)
    return pointer


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
    check_request(repo_id, revision)
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


def check_request(repo_id: str, revision: str) -> None:
    """Refuse a repo id or revision that would not name a folder inside the cache."""
    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise DownloadError(
            f"{repo_id!r} is not a repo id of the hub ({error})",
            "Name a model repo as org/name, e.g. mlx-community/Qwen3-0.6B-4bit",
        ) from error
    problem = relative_path_problem(revision)
    if problem is not None:
        raise DownloadError(
            f"The revision {revision!r} asked of {repo_id} {problem}: it is not a branch, tag or "
            "commit",
            "Use an existing branch, tag or commit (default: main)",
        )


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
    try:
        index_json = weight_index(index_path.parent)
    except ModelFormatError as error:
        raise DownloadError(
            f"{snapshot.repo_id}'s {INDEX_FILE} cannot say which files hold which layers: "
            f"{error.cause}",
            "Download the whole model instead (exo-tui models download without --layers)",
        ) from error
    assert index_json is not None, "_fetch_file put the index there"
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

    # Files with the same bytes share one blob (and one partial file): one at a time each.
    blob_locks = {job.file.etag: threading.Lock() for job in jobs}

    def run(job: _FileJob) -> None:
        try:
            with blob_locks[job.file.etag]:
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
    ref = inside_storage(storage, storage / "refs" / revision)
    ref.parent.mkdir(parents=True, exist_ok=True)
    if ref.is_file() and ref.read_text() == commit:
        return
    tmp = inside_storage(storage, ref.with_name(f".{ref.name}.tmp"), through_link=True)
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
    commit = _as_commit(revision)
    ref = storage / "refs" / revision
    if commit is None and ref.is_file():
        commit = _as_commit(ref.read_text().strip())  # older tools wrote what the hub said
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
