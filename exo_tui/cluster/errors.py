"""The cluster layer's errors: failures the user can act on, each naming its cause and fix."""

from __future__ import annotations


class ClusterError(Exception):
    """An error the user can act on, naming cause and fix; the CLI prints it without a traceback."""

    def __init__(self, cause: str, fix: str) -> None:
        super().__init__(f"{cause}. {fix}")
        self.cause = cause
        self.fix = fix


class IdentityError(ClusterError):
    """The cluster key or the node id cannot be used; ``cause`` and ``fix`` say why and how."""


class RingError(ClusterError):
    """A rank of the ring failed; every rank has been stopped."""


class LaunchError(ClusterError):
    """The instance could not be launched or kept running; its ranks are stopped."""
