"""One file of a repo made present in the cache: resumed from its partial file, and moved into
place only when its size and hash match the hub's.

Each file lands in `blobs/<etag>.incomplete`, kept across runs and resumed with a Range request
(huggingface_hub's own `http_get`), and is moved into place only when its sha256 (LFS files) or
git blob id (the others) matches the hub's metadata; huggingface_hub's own helper then links it
into the snapshot. Every path written is resolved and must lie in the repo's cache folder.
"""
# pyright: strict

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

# (huggingface_hub types some arguments as bare `dict` / `tqdm`: hence the ignores below.)
from huggingface_hub import hf_hub_url

# The cache's own way to link a snapshot file to its blob (a relative symlink, or a copy where
# links are off): private, but the one huggingface_hub uses, so the layout stays its own.
from huggingface_hub.file_download import (
    _create_symlink,  # pyright: ignore[reportPrivateUsage]
    http_get,  # pyright: ignore[reportUnknownVariableType]
)
from huggingface_hub.utils import build_hf_headers  # pyright: ignore[reportUnknownVariableType]

from exo_tui.hub.cache import HubSettings, inside_storage
from exo_tui.hub.errors import IntegrityError
from exo_tui.hub.remote import RemoteFile, RepoSnapshot

# Attempts at a file whose bytes do not match its hash before giving up.
_FETCH_ATTEMPTS = 2


@dataclass(frozen=True)
class FileJob:
    """One file of a snapshot to make present, and the paths in the cache it writes."""

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


def _matches(path: Path, job: FileJob) -> bool:
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
# Fetching


class Stopped(Exception):
    """Raised from the progress hook to abandon a file: the download was cancelled."""


class ProgressHook:
    """Stands in for tqdm inside huggingface_hub's `http_get`: counts bytes, honours a cancel."""

    def __init__(self, report: Callable[[int], None], *, initial: int = 0, **_: object) -> None:
        self._report = report
        self._bytes = initial

    def __enter__(self) -> ProgressHook:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def close(self) -> None:
        return None

    def update(self, n: float | None = 1) -> None:
        self._bytes += int(n or 0)
        self._report(self._bytes)


def fetch_file(job: FileJob, report: Callable[[int], None]) -> Path:
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


def _resume_into_partial(job: FileJob, report: Callable[[int], None]) -> None:
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
            tqdm_class=cast(Any, partial(ProgressHook, report)),
        )


def _link(job: FileJob) -> Path:
    """Link the verified blob into the snapshot as huggingface_hub does (no request: a link to
    the blob, or the file itself where links are off, stays as it is)."""
    pointer, blob = job.pointer, job.blob
    if pointer.is_symlink() and pointer.resolve() == blob.resolve():
        return pointer
    if not pointer.is_symlink() and pointer.is_file():
        return pointer  # links are off: fetch_file checked this copy (or its blob) already
    pointer.parent.mkdir(parents=True, exist_ok=True)
    _create_symlink(str(blob), str(pointer), new_blob=False)
    return pointer
