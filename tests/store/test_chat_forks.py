"""Branches in the store: a forked chat keeps its parent and the position it forked at."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from engine.types import Message
from exo_tui.store.chats import ChatStore
from exo_tui.store.records import new_chat
from exo_tui.store.schema import MIGRATIONS

SYSTEM = Message(role="system", content="Be brief.")
PARENT = (
    SYSTEM,
    Message(role="user", content="First question"),
    Message(role="assistant", content="First answer"),
    Message(role="user", content="Second question"),
    Message(role="assistant", content="Second answer"),
)


def test_a_database_from_before_branches_migrates_and_keeps_its_chats(tmp_path: Path) -> None:
    db = tmp_path / "chats.db"
    before = MIGRATIONS[:-1]  # the schema as it was before branches
    with ChatStore(db, migrations=before) as old:
        chat = old.create_chat("m")
        old.append(chat.id, Message(role="user", content="old question"))
    with sqlite3.connect(db) as raw:
        columns = {row[1] for row in raw.execute("PRAGMA table_info(chats)")}
        assert "parent_id" not in columns

    with ChatStore(db) as store:
        assert store.schema_version == len(MIGRATIONS)
        kept = store.get_chat(chat.id)
        assert (kept.parent_id, kept.fork_position) == (None, None)
        assert [m.content for m in store.messages(chat.id)] == ["old question"]

        branch = new_chat("m", fork_of=(chat.id, 0))
        store.append_turn(branch, (Message(role="user", content="new question"),))
        found = {c.id: c for c in store.list_chats()}
        assert (found[branch.id].parent_id, found[branch.id].fork_position) == (chat.id, 0)
    with sqlite3.connect(db) as raw:
        row = raw.execute("SELECT parent_id, fork_position FROM chats WHERE id = ?", (branch.id,))
        assert row.fetchone() == (chat.id, 0)


def test_a_branch_holds_its_own_messages_and_the_parent_is_unchanged(tmp_path: Path) -> None:
    with ChatStore(tmp_path / "chats.db") as store:
        parent = new_chat("m")
        store.append_turn(parent, PARENT)
        branch = new_chat("m", "First question", fork_of=(parent.id, 3))
        edited = Message(role="user", content="Second, edited")
        store.append_turn(branch, (*PARENT[:3], edited, Message(role="assistant", content="B")))

        assert store.messages(parent.id) == list(PARENT)
        assert [m.content for m in store.messages(branch.id)][3:] == ["Second, edited", "B"]
        got = store.get_chat(branch.id)
        assert (got.parent_id, got.fork_position, got.title) == (parent.id, 3, "First question")


def test_deleting_the_parent_keeps_the_branch_without_the_link(tmp_path: Path) -> None:
    with ChatStore(tmp_path / "chats.db") as store:
        parent = new_chat("m")
        store.append_turn(parent, PARENT)
        branch = new_chat("m", fork_of=(parent.id, 1))
        store.append_turn(branch, (SYSTEM, Message(role="user", content="other")))
        store.delete(parent.id)
        kept = store.get_chat(branch.id)
        assert (kept.parent_id, kept.fork_position) == (None, None)
        assert [m.content for m in store.messages(branch.id)] == ["Be brief.", "other"]


def test_a_branch_of_a_chat_the_store_never_got_is_written_without_the_link(
    tmp_path: Path,
) -> None:
    # Its parent was deleted before the branch's first turn could be saved: the turn is not
    # refused for a link to nothing.
    with ChatStore(tmp_path / "chats.db") as store:
        branch = new_chat("m", fork_of=("gone", 1))
        store.append_turn(branch, (SYSTEM, Message(role="user", content="kept")))
        kept = store.get_chat(branch.id)
        assert (kept.parent_id, kept.fork_position) == (None, None)
