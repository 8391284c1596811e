"""The hub's errors: each one the user can act on, naming the cause and the fix."""
# pyright: strict

from __future__ import annotations


class HubError(Exception):
    """An expected failure of the catalogue or a download; the CLI prints it without a
    traceback."""

    def __init__(self, cause: str, fix: str) -> None:
        super().__init__(f"{cause}. {fix}")
        self.cause = cause
        self.fix = fix


class DownloadError(HubError):
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


class OutsideCacheError(DownloadError):
    """A path to be written resolves outside the repo's cache folder (a link points out)."""
