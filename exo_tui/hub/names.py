"""The names a hub sends (hashes, file names, commits), checked before any becomes a path.

A file's hash names its blob in the cache, its name its place in the snapshot, the commit the
snapshot folder. A broken or hostile mirror (HF_ENDPOINT) could send a path in their stead
(`../../.bashrc`); the pydantic types here refuse one where the hub's answer is parsed.
"""
# pyright: strict

from __future__ import annotations

import re
from functools import partial
from typing import Annotated

from pydantic import AfterValidator

_HEX = re.compile(r"[0-9a-fA-F]+")


def check_hash(value: str, lengths: tuple[int, ...] = (40, 64)) -> str:
    """`value` in lower case when it is a hash of one of `lengths` hex characters."""
    if len(value) not in lengths or not _HEX.fullmatch(value):
        counts = " or ".join(str(n) for n in lengths)
        raise ValueError(f"is not a hash ({counts} hex characters)")
    return value.lower()


def as_commit(sha: object) -> str | None:
    """`sha` when it is a commit hash (in lower case), else None."""
    if not isinstance(sha, str):
        return None
    try:
        return check_hash(sha)
    except ValueError:
        return None


def relative_path_problem(name: str) -> str | None:
    """What keeps `name` from being a relative path that stays inside its folder, or None.

    Empty and "." parts are refused too: they would let two names stand for one file."""
    if not name:
        return "is empty"
    if "\0" in name:
        return "holds a NUL character"
    if "\\" in name:
        return "holds a backslash"
    if name.startswith("/"):
        return "is an absolute path"
    parts = name.split("/")
    if ".." in parts:
        return "climbs out of its folder with '..'"
    if any(part in ("", ".") for part in parts):
        return "has an empty or '.' part"
    return None


def check_relative_path(name: str) -> str:
    problem = relative_path_problem(name)
    if problem is not None:
        raise ValueError(f"{problem}, so it is not a relative path inside the repo")
    return name


Sha256 = Annotated[str, AfterValidator(partial(check_hash, lengths=(64,)))]
GitHash = Annotated[str, AfterValidator(check_hash)]  # a git object or commit id: sha1 or sha256
RepoFileName = Annotated[str, AfterValidator(check_relative_path)]
