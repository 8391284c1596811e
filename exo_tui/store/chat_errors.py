"""The chat store's errors, each in words that say what happened and what the user can do."""

from __future__ import annotations

import os
import pwd
import sqlite3
from pathlib import Path

from exo_tui.store.schema import BUSY_TIMEOUT_S


class ChatStoreError(Exception):
    """The chat history could not be read or written."""


class ChatNotFoundError(ChatStoreError, LookupError):
    """No chat has this id (deleted, or never created)."""

    def __init__(self, chat_id: str) -> None:
        super().__init__(f"no chat with id {chat_id!r}")
        self.chat_id = chat_id


class UnreadableChatDatabase(ChatStoreError):
    """The file is not a chat database this version can use; ``reason`` says why, in words.

    ``damaged``: it fails SQLite's own checks (not SQLite, corrupt pages), so setting it aside
    loses nothing; a healthy file that is merely not ours to use (another program's, a newer
    exo-tui's) is left where it is.
    """

    def __init__(self, path: Path, reason: str, *, damaged: bool = True) -> None:
        super().__init__(f"the chat database at {path} could not be read ({reason})")
        self.path = path
        self.reason = reason
        self.damaged = damaged


class ChatWriteError(ChatStoreError):
    """The database refused a write (disk full, locked, read-only); nothing of it was written.

    ``reason`` and ``fix`` are in the user's words; ``code`` is SQLite's extended result code.
    """

    def __init__(self, path: Path, reason: str, fix: str, code: int = 0) -> None:
        super().__init__(f"could not write to {path}: {reason}. {fix}")
        self.path = path
        self.reason = reason
        self.fix = fix
        self.code = code


def write_error(path: Path, error: sqlite3.Error) -> ChatWriteError:
    """A refused write, in words: what happened and what the user can do about it."""
    code: int = getattr(error, "sqlite_errorcode", 0) or 0
    match code & 0xFF:
        case sqlite3.SQLITE_FULL:
            reason = "the disk is full"
            fix = f"Free some space on the disk that holds {path.parent}."
        case sqlite3.SQLITE_BUSY | sqlite3.SQLITE_LOCKED:
            reason = f"another program has held a lock on it for more than {BUSY_TIMEOUT_S:g} s"
            fix = "Close the other exo-tui (or whatever has the file open)."
        case sqlite3.SQLITE_READONLY:
            reason = "the file is read-only"
            fix = f"Make it yours again: sudo chown -R {current_user()} {path.parent}"
        case _:
            reason = str(error)
            fix = f"Check the disk that holds {path.parent}."
    return ChatWriteError(path, reason, fix, code)


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def current_user() -> str:
    """Who this process writes as (not $USER, which sudo and su may leave as it was)."""
    return user_name(os.geteuid())
