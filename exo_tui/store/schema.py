"""The chat database's schema: its migrations and what SQLite's result codes mean for it."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

BUSY_TIMEOUT_S = 5.0


Migration = Callable[[sqlite3.Connection], None]


def _schema_v1(conn: sqlite3.Connection) -> None:
    conn.execute(
        """
        CREATE TABLE chats (
            id TEXT PRIMARY KEY,
            title TEXT,
            model TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )
        """
    )
    conn.execute(
        """
        CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            chat_id TEXT NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            role TEXT NOT NULL,
            content TEXT NOT NULL,
            reasoning TEXT,
            tool_calls TEXT NOT NULL DEFAULT '[]',
            tool_call_id TEXT,
            name TEXT,
            stats TEXT,
            created_at REAL NOT NULL,
            UNIQUE (chat_id, position)
        )
        """
    )
    conn.execute("CREATE INDEX chats_by_updated ON chats (updated_at)")


def _chat_settings(conn: sqlite3.Connection) -> None:
    conn.execute("ALTER TABLE chats ADD COLUMN settings TEXT")  # ChatSettings as JSON


def _chat_forks(conn: sqlite3.Connection) -> None:
    # A branch outlives its parent: deleting the parent only drops the link.
    conn.execute(
        "ALTER TABLE chats ADD COLUMN parent_id TEXT REFERENCES chats(id) ON DELETE SET NULL"
    )
    conn.execute("ALTER TABLE chats ADD COLUMN fork_position INTEGER")


MIGRATIONS: tuple[Migration, ...] = (_schema_v1, _chat_settings, _chat_forks)


SQLITE_HEADER = b"SQLite format 3\x00"


# SQLite result codes that mean the bytes on disk are not a usable database.
UNREADABLE_CODES = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})


# What a read-only open of a WAL database says when it cannot make the -shm it reads through.
NO_SHM_CODES = frozenset({sqlite3.SQLITE_READONLY_DIRECTORY, sqlite3.SQLITE_CANTOPEN})
