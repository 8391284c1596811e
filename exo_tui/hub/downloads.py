"""Model downloads from the Hugging Face hub into its cache, as a generator of progress events.

`files = yield from download(repo)` fetches a repo's files (or only the safetensors holding some
layers) into the normal hub cache, where `engine.models.finding.find_models` finds them, and
returns the snapshot folder. The hub is reached only through huggingface_hub; the environment
(HF_ENDPOINT, HF_HUB_CACHE / HF_HOME, HF_HUB_OFFLINE, HF_TOKEN) is read at each call, not when
huggingface_hub was imported.

Why not plain `snapshot_download`: huggingface_hub 2.x writes each file to a process-unique
`.incomplete` file that it deletes when the download fails, so an interrupted download starts
again from zero, and it never checks a file's hash; exo_tui.hub.fetch resumes and checks each
file. Not `hf_hub_download` for that either: it takes each file's ETag and commit from the
hub's headers as paths in the cache, so a hostile mirror could write outside it. Every name the
hub sends is checked (exo_tui.hub.names) before it becomes a path.
"""
# pyright: strict

from __future__ import annotations

import queue
import shutil
import threading
from collections.abc import Collection, Generator, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

from huggingface_hub.utils import filter_repo_objects

from engine.errors import EngineError, ModelFormatError
from engine.models.weights import INDEX_FILE, layer_of, shard_files, weight_index
from exo_tui.hub.cache import HubSettings, cached_snapshot, write_ref
from exo_tui.hub.errors import (
    DiskSpaceError,
    DownloadCancelled,
    DownloadError,
    HubError,
    HubOfflineError,
)
from exo_tui.hub.fetch import FileJob, Stopped, fetch_file
from exo_tui.hub.progress import DownloadProgress
from exo_tui.hub.remote import RemoteFile, RepoSnapshot, check_request, hub_error, repo_snapshot

Downloading = Generator[DownloadProgress, None, Path]


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
    jobs = [FileJob(snapshot, f, settings) for f in files]
    check_disk_space(repo_id, jobs, settings.cache_dir)
    yield from _run_jobs(jobs, cancel, max_workers)
    write_ref(settings.storage(repo_id), revision, snapshot.commit)
    return settings.storage(repo_id) / "snapshots" / snapshot.commit


# --------------------------------------------------------------------------------------------
# Which files


def _index_layers(index_json: Mapping[str, Any]) -> int:
    weight_map = cast(dict[str, object], index_json.get("weight_map") or {})
    layers = [layer for w in weight_map if (layer := layer_of(w)) is not None]
    return max(layers, default=-1) + 1


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
    index_path = fetch_file(FileJob(snapshot, index, settings), lambda _: None)
    try:
        index_json = weight_index(index_path.parent)
    except ModelFormatError as error:
        raise DownloadError(
            f"{snapshot.repo_id}'s {INDEX_FILE} cannot say which files hold which layers: "
            f"{error.cause}",
            "Download the whole model instead (exo-tui models download without --layers)",
        ) from error
    assert index_json is not None, "fetch_file put the index there"
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


def check_disk_space(repo_id: str, jobs: Iterable[FileJob], cache_dir: Path) -> None:
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


# --------------------------------------------------------------------------------------------
# The files on a few threads


@dataclass
class _Landed:
    file: str
    file_bytes: int


@dataclass
class _Finished:
    file: str
    error: BaseException | None


def _run_jobs(
    jobs: Collection[FileJob], cancel: threading.Event | None, max_workers: int
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
            raise Stopped
        events.put(_Landed(name, file_bytes))

    # Files with the same bytes share one blob (and one partial file): one at a time each.
    blob_locks = {job.file.etag: threading.Lock() for job in jobs}

    def run(job: FileJob) -> None:
        try:
            with blob_locks[job.file.etag]:
                fetch_file(job, partial(report, job.file.name))
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
                        bytes_total=total,
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
    if isinstance(error, Stopped):
        if cancel is not None and cancel.is_set():
            return DownloadCancelled(
                f"The download of {repo_id} was cancelled",
                "Run it again to resume: finished and partial files are kept",
            )
        return DownloadError(f"The download of {repo_id} stopped", "Run it again to resume")
    if isinstance(error, HubError | EngineError):
        return error
    mapped = hub_error(cast(Exception, error), repo_id, "", settings)
    if mapped is not error:
        return mapped
    if isinstance(error, OSError):
        return DownloadError(
            f"The download of {repo_id} failed: {error}",
            "Check the disk and the network, then run again to resume",
        )
    return error
