"""Chat history in SQLite: chats and their messages, each committed the moment it is written.

One connection in WAL mode is shared by every thread behind a lock (the app writes from
worker threads). Every write is its own transaction with ``synchronous=FULL``, so a message
that ``append`` returned from survives a crash of the process, or of the machine.

``exo_tui.store.opening.open_chat_store`` is the way in for the app (a damaged file is moved aside,
one the user cannot write is opened read-only). A write the database refuses (disk full, a lock held
too long) raises ``ChatWriteError`` and leaves nothing of itself behind: a turn is written whole or
not at all (``append_turn``).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from engine.types import Message, ToolCall
from exo_tui.store.chat_errors import (
    ChatNotFoundError,
    ChatStoreError,
    ChatWriteError,
    UnreadableChatDatabase,
    write_error,
)
from exo_tui.store.export import render_markdown
from exo_tui.store.records import (
    DEFAULT_TITLE,
    ChatMatch,
    ChatSettings,
    ChatSummary,
    StoredMessage,
    as_time,
    auto_title,
    new_chat,
    settings_of,
    snippet,
)
from exo_tui.store.schema import (
    BUSY_TIMEOUT_S,
    MIGRATIONS,
    NO_SHM_CODES,
    SQLITE_HEADER,
    UNREADABLE_CODES,
    Migration,
)


class ChatStore:
    """Chats and their messages in one SQLite file; safe to share between threads."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        migrations: Sequence[Migration] = MIGRATIONS,
        read_only: bool = False,
    ) -> None:
        """Open (creating if need be) and migrate the database at ``path`` (or ``":memory:"``).

        ``read_only``: open an existing file without ever writing to it (nor beside it, where
        that can be helped); every write then raises ChatWriteError.

        Raises UnreadableChatDatabase when the file is not a usable chat database, and
        ChatStoreError for other failures (locked by another process for too long, say).
        """
        self.path = Path(path)
        self.read_only = read_only
        self._lock = threading.RLock()
        if str(path) != ":memory:" and self.path.is_file():
            self._check_file()
        try:
            self._conn = self._connect(str(path))
        except sqlite3.Error as error:
            raise ChatStoreError(f"could not open the chat database at {path}: {error}") from error
        try:
            self._setup(migrations)
        except (sqlite3.Error, ChatWriteError) as error:
            self._conn.close()
            code = error.code if isinstance(error, ChatWriteError) else error.sqlite_errorcode
            if code & 0xFF in UNREADABLE_CODES:
                raise UnreadableChatDatabase(self.path, str(error)) from error
            raise ChatStoreError(f"could not open the chat database at {path}: {error}") from error
        except BaseException:
            self._conn.close()
            raise

    def _connect(self, path: str) -> sqlite3.Connection:
        def connect(target: str, uri: bool = False) -> sqlite3.Connection:
            return sqlite3.connect(
                target,
                timeout=BUSY_TIMEOUT_S,
                isolation_level=None,
                check_same_thread=False,
                uri=uri,
            )

        if not self.read_only:
            return connect(path)
        uri = self.path.absolute().as_uri()
        conn = connect(f"{uri}?mode=ro", uri=True)
        try:
            conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
            return conn
        except sqlite3.Error as error:
            conn.close()
            # A WAL database needs its -shm beside it even to be read; in a folder the user
            # cannot write (or on a read-only mount) SQLite cannot make one. With no -wal there
            # is nothing but the main file to read, and no one else writes it here, so reading
            # it as immutable is exact.
            wal = self.path.with_name(self.path.name + "-wal")
            if error.sqlite_errorcode not in NO_SHM_CODES or wal.exists():
                raise
        return connect(f"{uri}?mode=ro&immutable=1", uri=True)

    def _check_file(self) -> None:
        # Before SQLite sees it: on closing a connection to a file that is not a database,
        # SQLite deletes the -wal beside it, which may hold the last writes of a damaged one.
        if not os.access(self.path, os.R_OK):
            raise ChatStoreError(f"{self.path} cannot be read: permission denied")
        try:
            with self.path.open("rb") as file:
                header = file.read(len(SQLITE_HEADER))
        except OSError as error:
            raise UnreadableChatDatabase(self.path, error.strerror or str(error)) from error
        if header and header != SQLITE_HEADER:
            raise UnreadableChatDatabase(self.path, "it is not an SQLite database")

    def _setup(self, migrations: Sequence[Migration]) -> None:
        conn = self._conn
        # The first statement that reads the file: garbage fails here with SQLITE_NOTADB.
        if self.read_only:
            conn.execute("PRAGMA schema_version").fetchone()
        else:
            conn.execute("PRAGMA journal_mode = WAL").fetchone()
            conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
        problems = [row[0] for row in conn.execute("PRAGMA quick_check").fetchall()]
        if problems != ["ok"]:
            raise UnreadableChatDatabase(self.path, f"it is damaged: {problems[0]}")
        if self.read_only:
            self._check_read_only_schema(migrations)
            return
        with self._write():
            tables = {
                row[0]
                for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                if not row[0].startswith("sqlite_")
            }
            if "schema_version" not in tables:
                if tables:
                    raise UnreadableChatDatabase(
                        self.path,
                        "it is an SQLite database, but not one of exo-tui's chats",
                        damaged=False,
                    )
                conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
                conn.execute("INSERT INTO schema_version (version) VALUES (0)")
            row = conn.execute("SELECT version FROM schema_version").fetchone()
            version = self._version(row, migrations)
            for migrate in migrations[version:]:
                migrate(conn)
            conn.execute("UPDATE schema_version SET version = ?", (len(migrations),))
        self.schema_version = len(migrations)

    def _version(self, row: tuple[Any, ...] | None, migrations: Sequence[Migration]) -> int:
        if row is None:
            raise UnreadableChatDatabase(self.path, "its schema version is missing", damaged=False)
        version: int = row[0]
        if version > len(migrations):
            raise UnreadableChatDatabase(
                self.path,
                f"it was written by a newer exo-tui: schema version {version}, "
                f"this one knows up to {len(migrations)}",
                damaged=False,
            )
        return version

    def _check_read_only_schema(self, migrations: Sequence[Migration]) -> None:
        """A file opened read-only is read as it is: it must already be this version's."""
        conn = self._conn
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        if "schema_version" not in tables:
            raise UnreadableChatDatabase(
                self.path, "it is an SQLite database, but not one of exo-tui's chats", damaged=False
            )
        row = conn.execute("SELECT version FROM schema_version").fetchone()
        version = self._version(row, migrations)
        if version < len(migrations):
            raise ChatStoreError(
                f"{self.path} needs upgrading to schema version {len(migrations)}, "
                "and it cannot be written"
            )
        self.schema_version = version

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (IMMEDIATE) so concurrent writers queue up.

        A write SQLite refuses is rolled back whole and raised as ChatWriteError.
        """
        with self._lock:
            conn = self._conn
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as error:
                raise write_error(self.path, error) from error

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    def _require_chat(self, conn: sqlite3.Connection, chat_id: str) -> tuple[Any, ...]:
        row = conn.execute("SELECT title FROM chats WHERE id = ?", (chat_id,)).fetchone()
        if row is None:
            raise ChatNotFoundError(chat_id)
        return row

    # Chats

    def create_chat(self, model: str, title: str | None = None) -> ChatSummary:
        """A new, empty chat. Without a title it takes one from its first user message."""
        chat = new_chat(model, title)
        now = chat.created_at.timestamp()
        with self._write() as conn:
            conn.execute(
                "INSERT INTO chats (id, title, model, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (chat.id, None if chat.title == DEFAULT_TITLE else chat.title, model, now, now),
            )
        return chat

    _SUMMARY_SQL = """
        SELECT c.id, c.title, c.model, c.created_at, c.updated_at,
               (SELECT COUNT(*) FROM messages m WHERE m.chat_id = c.id), c.settings,
               c.parent_id, c.fork_position
        FROM chats c
    """

    @staticmethod
    def _summary(row: Sequence[Any]) -> ChatSummary:
        chat_id, title, model, created_at, updated_at, count, settings, parent, fork_at = row
        return ChatSummary(
            id=chat_id,
            title=title or DEFAULT_TITLE,
            model=model,
            created_at=as_time(created_at),
            updated_at=as_time(updated_at),
            message_count=count,
            settings=settings_of(settings),
            parent_id=parent,
            fork_position=fork_at if parent is not None else None,
        )

    def get_chat(self, chat_id: str) -> ChatSummary:
        rows = self._read(self._SUMMARY_SQL + " WHERE c.id = ?", (chat_id,))
        if not rows:
            raise ChatNotFoundError(chat_id)
        return self._summary(rows[0])

    def list_chats(self) -> list[ChatSummary]:
        """Every chat, the one with the latest message first."""
        rows = self._read(self._SUMMARY_SQL + " ORDER BY c.updated_at DESC, c.rowid DESC")
        return [self._summary(row) for row in rows]

    def search(self, text: str, limit: int = 500) -> list[ChatMatch]:
        """The chats whose user or assistant messages hold `text`, the latest chat first, each
        with its first such message. Case is ignored for ASCII letters (SQLite's LIKE)."""
        wanted = text.strip()
        if not wanted:
            return []
        pattern = "%" + re.sub(r"([\\%_])", r"\\\1", wanted) + "%"
        # With MIN(), SQLite takes the bare columns from the row that holds the minimum.
        rows = self._read(
            "SELECT m.chat_id, MIN(m.position), m.content FROM messages m "
            "JOIN chats c ON c.id = m.chat_id "
            "WHERE m.role IN ('user', 'assistant') AND m.content LIKE ? ESCAPE '\\' "
            "GROUP BY m.chat_id ORDER BY MAX(c.updated_at) DESC LIMIT ?",
            (pattern, limit),
        )
        return [
            ChatMatch(chat_id=chat_id, position=position, snippet=snippet(content, wanted))
            for chat_id, position, content in rows
        ]

    def rename(self, chat_id: str, title: str) -> None:
        """Give a chat a title of the user's own (whitespace folded; it must not be empty)."""
        clean = " ".join(title.split())
        if not clean:
            raise ValueError("a chat title cannot be empty")
        with self._write() as conn:
            self._require_chat(conn, chat_id)
            conn.execute("UPDATE chats SET title = ? WHERE id = ?", (clean, chat_id))

    def set_settings(
        self, chat_id: str, settings: ChatSettings, opening_prompt: str | None = None
    ) -> None:
        """Keep a chat's settings. ``opening_prompt``: the system prompt they give, written
        into the system message that opens the chat, so its history says what the model was
        told."""
        with self._write() as conn:
            self._require_chat(conn, chat_id)
            conn.execute(
                "UPDATE chats SET settings = ? WHERE id = ?",
                (settings.model_dump_json(), chat_id),
            )
            if opening_prompt is not None:
                conn.execute(
                    "UPDATE messages SET content = ? "
                    "WHERE chat_id = ? AND position = 0 AND role = 'system'",
                    (opening_prompt, chat_id),
                )

    def delete(self, chat_id: str) -> None:
        """Delete a chat and all its messages."""
        with self._write() as conn:
            if conn.execute("DELETE FROM chats WHERE id = ?", (chat_id,)).rowcount == 0:
                raise ChatNotFoundError(chat_id)

    # Messages

    @staticmethod
    def _columns(message: Message, stats: dict[str, Any] | None) -> tuple[Any, ...]:
        tool_calls = json.dumps(
            [call.model_dump(mode="json") for call in message.tool_calls], ensure_ascii=False
        )
        stats_json = None if stats is None else json.dumps(stats, ensure_ascii=False)
        return (
            message.role,
            message.content,
            message.reasoning,
            tool_calls,
            message.tool_call_id,
            message.name,
            stats_json,
        )

    def append(self, chat_id: str, message: Message, stats: dict[str, Any] | None = None) -> int:
        """Add a message at the end of a chat, committed before this returns; its position.

        ``stats`` is any JSON-able dict (usage, TTFT, tok/s) shown beside the message.
        """
        columns = self._columns(message, stats)  # a stats dict that is not JSON fails here
        now = time.time()
        with self._write() as conn:
            (title,) = self._require_chat(conn, chat_id)
            (position,) = conn.execute(
                "SELECT COALESCE(MAX(position) + 1, 0) FROM messages WHERE chat_id = ?",
                (chat_id,),
            ).fetchone()
            conn.execute(
                "INSERT INTO messages (chat_id, position, role, content, reasoning, tool_calls, "
                "tool_call_id, name, stats, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (chat_id, position, *columns, now),
            )
            new_title = title
            if title is None and message.role == "user":
                new_title = auto_title(message.content)
            conn.execute(
                "UPDATE chats SET updated_at = ?, title = ? WHERE id = ?",
                (now, new_title, chat_id),
            )
        return position

    def append_turn(
        self,
        chat: ChatSummary,
        messages: Sequence[Message],
        *,
        stats: Sequence[dict[str, Any] | None] = (),
        replace_from: int | None = None,
    ) -> list[int]:
        """Add a turn's messages at the end of its chat in one transaction: all or none.

        The chat is created first if the file does not hold it yet (a chat begun in memory);
        a branch whose parent is gone by then (deleted) is written without the link.
        ``stats``: each message's stats, in order (as ``append``'s; missing ones are None).
        ``replace_from``: drop the chat's messages from this position on first, in the same
        transaction (a regenerated answer, an edited message). Returns the messages' positions.
        """
        if replace_from is not None and replace_from < 0:
            raise ValueError(f"a message position is 0 or more, not {replace_from}")
        if len(stats) > len(messages):
            raise ValueError(f"{len(stats)} stats for {len(messages)} messages")
        padded = [*stats, *[None] * (len(messages) - len(stats))]
        columns = [self._columns(m, s) for m, s in zip(messages, padded, strict=True)]
        now = time.time()
        with self._write() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO chats (id, title, model, created_at, updated_at, settings, "
                "parent_id, fork_position) "
                "VALUES (?, ?, ?, ?, ?, ?, (SELECT id FROM chats WHERE id = ?), ?)",
                (
                    chat.id,
                    None if chat.title == DEFAULT_TITLE else chat.title,
                    chat.model,
                    chat.created_at.timestamp(),
                    chat.created_at.timestamp(),
                    chat.settings.model_dump_json(),
                    chat.parent_id,
                    chat.fork_position,
                ),
            )
            (title,) = self._require_chat(conn, chat.id)
            if replace_from is not None:
                conn.execute(
                    "DELETE FROM messages WHERE chat_id = ? AND position >= ?",
                    (chat.id, replace_from),
                )
            (start,) = conn.execute(
                "SELECT COALESCE(MAX(position) + 1, 0) FROM messages WHERE chat_id = ?",
                (chat.id,),
            ).fetchone()
            positions = list(range(start, start + len(columns)))
            conn.executemany(
                "INSERT INTO messages (chat_id, position, role, content, reasoning, tool_calls, "
                "tool_call_id, name, stats, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(chat.id, p, *c, now) for p, c in zip(positions, columns, strict=True)],
            )
            for message in messages:
                if title is None and message.role == "user":
                    title = auto_title(message.content)
            conn.execute(
                "UPDATE chats SET updated_at = ?, title = ? WHERE id = ?", (now, title, chat.id)
            )
        return positions

    def replace_last(
        self, chat_id: str, message: Message, stats: dict[str, Any] | None = None
    ) -> int:
        """Overwrite the last message of a chat (a regenerated answer); its position."""
        columns = self._columns(message, stats)
        now = time.time()
        with self._write() as conn:
            self._require_chat(conn, chat_id)
            (position,) = conn.execute(
                "SELECT MAX(position) FROM messages WHERE chat_id = ?", (chat_id,)
            ).fetchone()
            if position is None:
                raise ChatStoreError(f"chat {chat_id!r} has no message to replace")
            conn.execute(
                "UPDATE messages SET role = ?, content = ?, reasoning = ?, tool_calls = ?, "
                "tool_call_id = ?, name = ?, stats = ?, created_at = ? "
                "WHERE chat_id = ? AND position = ?",
                (*columns, now, chat_id, position),
            )
            conn.execute("UPDATE chats SET updated_at = ? WHERE id = ?", (now, chat_id))
        return position

    def truncate(self, chat_id: str, position: int) -> int:
        """Drop the message at ``position`` and every one after it (edit, regenerate); how many."""
        if position < 0:
            raise ValueError(f"a message position is 0 or more, not {position}")
        with self._write() as conn:
            self._require_chat(conn, chat_id)
            deleted = conn.execute(
                "DELETE FROM messages WHERE chat_id = ? AND position >= ?", (chat_id, position)
            ).rowcount
            conn.execute("UPDATE chats SET updated_at = ? WHERE id = ?", (time.time(), chat_id))
        return deleted

    def entries(self, chat_id: str) -> list[StoredMessage]:
        """A chat's messages in order, with their positions, stats and times."""
        with self._lock:
            self._require_chat(self._conn, chat_id)
            rows = self._conn.execute(
                "SELECT position, role, content, reasoning, tool_calls, tool_call_id, name, "
                "stats, created_at FROM messages WHERE chat_id = ? ORDER BY position",
                (chat_id,),
            ).fetchall()
        entries: list[StoredMessage] = []
        for position, role, content, reasoning, tool_calls, call_id, name, stats, at in rows:
            message = Message.model_validate(
                {
                    "role": role,
                    "content": content,
                    "reasoning": reasoning,
                    "tool_calls": [ToolCall.model_validate(c) for c in json.loads(tool_calls)],
                    "tool_call_id": call_id,
                    "name": name,
                }
            )
            entries.append(
                StoredMessage(
                    position=position,
                    message=message,
                    stats=None if stats is None else json.loads(stats),
                    created_at=as_time(at),
                )
            )
        return entries

    def messages(self, chat_id: str) -> list[Message]:
        """A chat's messages in order, ready to send back to the model."""
        return [entry.message for entry in self.entries(chat_id)]

    def export_markdown(self, chat_id: str) -> str:
        """The chat as a Markdown document (see ``render_markdown``)."""
        with self._lock:  # one consistent view of the chat and its messages
            return render_markdown(self.get_chat(chat_id), self.messages(chat_id))

    # Lifetime

    def close(self) -> None:
        """Fold the write-ahead log into the database file, then close.

        Until the checkpoint the last writes live only in ``-wal`` beside the file: a copy of
        ``chats.db`` alone (a backup, a move to another machine) would lack them.
        """
        with self._lock:
            if not self.read_only:
                # Another connection still reading makes it fail: SQLite folds it in later.
                with suppress(sqlite3.Error):
                    self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            self._conn.close()

    def __enter__(self) -> ChatStore:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
