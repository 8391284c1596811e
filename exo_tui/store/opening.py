"""Opening the chat history whatever is there: a damaged file moved aside, one this user
cannot write opened read-only, anything else kept in memory, with a notice that names the fix."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

from exo_tui.store import paths
from exo_tui.store.chat_errors import (
    ChatStoreError,
    UnreadableChatDatabase,
    current_user,
    user_name,
)
from exo_tui.store.chats import ChatStore


class OpenedChatStore(NamedTuple):
    """What ``open_chat_store`` gives back; ``notice`` is for the user, None when all went well."""

    store: ChatStore
    notice: str | None


def open_chat_store(path: str | os.PathLike[str] | None = None) -> OpenedChatStore:
    """Open the chat history at ``path`` (default: the data dir's chats.db), whatever is there.

    A file that fails SQLite's checks is moved aside to ``<name>.broken-<timestamp>`` and a new
    one started. A healthy one this user cannot write is opened read-only. Anything else that
    cannot be used (another program's database, a newer exo-tui's, a folder that cannot be made)
    is left as it is and the store lives in memory for this session. ``notice`` says what
    happened and what to do about it, in the user's words.
    """
    db = Path(path) if path is not None else paths.chats_db_path()
    unwritable = _unwritable(db) if db.is_file() else None
    if unwritable is not None:
        return _read_only(db, unwritable)
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
        return OpenedChatStore(ChatStore(db), None)
    except UnreadableChatDatabase as error:
        if not error.damaged:
            return _in_memory(db, error.reason, fix=f"Move {db} away to start a new history.")
        reason = error.reason
    except (ChatStoreError, OSError) as error:
        return _in_memory(db, str(error))
    try:
        aside = _move_aside(db)
        store = ChatStore(db)
    except (ChatStoreError, OSError) as error:
        return _in_memory(db, f"{reason}; moving it aside failed: {error}")
    notice = (
        f"The chat database at {db} could not be read ({reason}); "
        f"it was moved to {aside} and a new one started."
    )
    return OpenedChatStore(store, notice)


def _unwritable(db: Path) -> Path | None:
    """The first of the database, the files SQLite keeps beside it and its folder that this
    user cannot write; None when SQLite can write them all."""
    sidecars = [db.with_name(db.name + suffix) for suffix in ("-wal", "-shm", "-journal")]
    files = [db, *(sidecar for sidecar in sidecars if sidecar.exists()), db.parent]
    return next((file for file in files if not os.access(file, os.W_OK)), None)


def _owner(path: Path) -> str:
    return user_name(path.stat().st_uid)


def _read_only(db: Path, unwritable: Path) -> OpenedChatStore:
    """A healthy database this user cannot write (left by ``sudo exo-tui``): read, never moved."""
    user = current_user()
    fix = f"To save chats again, quit and make it yours: sudo chown -R {user} {db.parent}"
    try:
        store = ChatStore(db, read_only=True)
    except UnreadableChatDatabase as error:
        if not error.damaged:
            return _in_memory(db, error.reason, fix=f"Move {db} away to start a new history.")
        return _in_memory(db, f"{error.reason}; it cannot be moved aside either", fix=fix)
    except ChatStoreError as error:
        return _in_memory(db, str(error), fix=fix)
    owner = _owner(unwritable)
    if owner != user:
        why = f"{unwritable} belongs to {owner}, not to you ({user}); was exo-tui run with sudo?"
    else:  # a read-only mount, or permissions taken away
        why = f"{unwritable} is read-only for you ({user})."
        fix = f"To save chats again, quit and make {unwritable} writable (chmod u+w, or remount)."
    notice = (
        f"The chat database at {db} cannot be written: {why} Your history is shown read-only "
        f"and new chats are not saved this session. {fix}"
    )
    return OpenedChatStore(store, notice)


def _in_memory(db: Path, reason: str, fix: str = "") -> OpenedChatStore:
    notice = (
        f"The chat database at {db} could not be opened ({reason}); "
        "chats will not be saved this session."
    )
    return OpenedChatStore(ChatStore(":memory:"), f"{notice} {fix}" if fix else notice)


def _move_aside(db: Path) -> Path:
    """Rename a broken database (and its WAL and journal files) out of the way; the new name."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    aside = db.with_name(f"{db.name}.broken-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = db.with_name(f"{db.name}.broken-{stamp}-{n}")
    db.rename(aside)
    # A leftover WAL beside a new database of the same name would be replayed into it.
    for suffix in ("-wal", "-shm", "-journal"):
        sidecar = db.with_name(db.name + suffix)
        if sidecar.exists():
            sidecar.rename(aside.with_name(aside.name + suffix))
    return aside
