"""Asking the hub what a repo holds at a commit (files, sizes, hashes), each name checked, and
huggingface_hub's failures as errors that say what to do."""
# pyright: strict

from __future__ import annotations

from typing import Any, cast

import httpx2
from huggingface_hub import HfApi
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoSibling
from huggingface_hub.utils import validate_repo_id
from pydantic import Field, ValidationError
from pydantic_core import ErrorDetails

from engine.types import Frozen
from exo_tui.hub.cache import DEFAULT_ENDPOINT, HubSettings
from exo_tui.hub.errors import DownloadError, HubOfflineError, RepoGatedError, RepoNotFoundError
from exo_tui.hub.names import (
    GitHash,
    RepoFileName,
    Sha256,
    as_commit,
    relative_path_problem,
)


class HubAnswerError(DownloadError):
    """The hub's answer about a repo cannot be used: a hash or name in it is not one."""

    def __init__(self, settings: HubSettings, repo_id: str, detail: str) -> None:
        super().__init__(
            f"The hub at {settings.endpoint} sent an unusable answer about {repo_id}: {detail}",
            "Nothing of it was written. A broken or hostile mirror answers so: unset HF_ENDPOINT "
            f"(the default is {DEFAULT_ENDPOINT}) or point it at a mirror you trust",
        )


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


def hub_error(error: Exception, repo_id: str, revision: str, settings: HubSettings) -> Exception:
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
    # huggingface_hub lets its transport's errors (no connection, a timeout) through unwrapped.
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
        raise hub_error(error, repo_id, revision, settings) from error
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        # huggingface_hub reads the JSON into its ModelInfo as it comes
        detail = f"not a model info ({type(error).__name__}: {error})"
        raise HubAnswerError(settings, repo_id, detail) from error
    commit = as_commit(info.sha)
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
