"""How far a download has come: the one progress type that downloads yield, a node sends its
coordinator and the cluster state holds."""
# pyright: strict

from __future__ import annotations

from typing import Literal

from pydantic import Field

from engine.types import Frozen


class DownloadProgress(Frozen):
    """More bytes of `file` landed: that file's count and the whole download's."""

    type: Literal["download"] = "download"
    repo_id: str = ""
    file: str = ""  # the file landing now
    file_bytes: int = Field(default=0, ge=0)
    file_total: int = Field(default=0, ge=0)
    bytes_done: int = Field(default=0, ge=0)
    bytes_total: int = Field(default=0, ge=0)
    files_done: int = Field(default=0, ge=0)
    files_total: int = Field(default=0, ge=0)
