"""Chat history: round trips, crash safety, ordering, export, recovery from a broken file."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.types import Message, ToolCall
from exo_tui.store import paths
from exo_tui.store.chat_errors import ChatNotFoundError, ChatStoreError, UnreadableChatDatabase
from exo_tui.store.chats import ChatStore
from exo_tui.store.export import render_markdown
from exo_tui.store.opening import open_chat_store
from exo_tui.store.records import DEFAULT_TITLE, ChatSummary, auto_title
from exo_tui.store.schema import MIGRATIONS

ROOT = Path(__file__).resolve().parents[2]

CONVERSATION = [
    Message(role="system", content="You are terse."),
    Message(role="user", content="What is 17 × 23? Answer in one line, please."),
    Message(
        role="assistant",
        content="",
        reasoning="I should use the calculator.\nIt is exact.",
        tool_calls=(
            ToolCall(
                id="call_1",
                name="calculator",
                arguments={"expression": "17 * 23", "options": {"precision": 0, "tags": ["ü"]}},
            ),
        ),
    ),
    Message(role="tool", content="391", tool_call_id="call_1", name="calculator"),
    Message(role="assistant", content="17 × 23 = **391**."),
]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "data" / "chats.db"


@pytest.fixture
def store(db: Path) -> Iterator[ChatStore]:
    db.parent.mkdir(parents=True)
    with ChatStore(db) as opened:
        yield opened


def test_paths_follow_exo_tui_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(paths.HOME_ENV, str(tmp_path / "home"))
    assert paths.data_dir() == tmp_path / "home" / "data"
    assert paths.config_dir() == tmp_path / "home" / "config"
    assert paths.chats_db_path() == tmp_path / "home" / "data" / "chats.db"


def test_paths_default_to_platformdirs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(paths.HOME_ENV, raising=False)
    assert paths.data_dir().name == "exo-tui"
    assert paths.config_dir().name == "exo-tui"
    monkeypatch.setenv(paths.HOME_ENV, "  ")  # blank counts as unset
    assert paths.home_override() is None


def test_open_chat_store_defaults_to_the_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(paths.HOME_ENV, str(tmp_path))
    store, notice = open_chat_store()
    with store:
        assert notice is None
        assert store.path == tmp_path / "data" / "chats.db"
        assert store.path.is_file()


def test_messages_with_tool_calls_round_trip(store: ChatStore) -> None:
    chat = store.create_chat("tiny-llama")
    stats = {"usage": {"prompt_tokens": 12, "completion_tokens": 7}, "decode_tps": 41.5}
    positions = [
        store.append(chat.id, message, stats=stats if message.role == "assistant" else None)
        for message in CONVERSATION
    ]
    assert positions == [0, 1, 2, 3, 4]
    assert store.messages(chat.id) == CONVERSATION
    entries = store.entries(chat.id)
    assert [entry.position for entry in entries] == positions
    assert entries[1].stats is None
    assert entries[2].stats == stats
    assert entries[2].message.tool_calls[0].arguments["options"]["tags"] == ["ü"]


def test_chat_survives_reopen(db: Path, store: ChatStore) -> None:
    chat = store.create_chat("tiny-llama")
    for message in CONVERSATION:
        store.append(chat.id, message)
    store.close()
    with ChatStore(db) as reopened:
        assert reopened.messages(chat.id) == CONVERSATION
        assert reopened.list_chats()[0].message_count == len(CONVERSATION)


CRASHING_CHILD = """
import os, signal, sys
from engine.types import Message, ToolCall
from exo_tui.store.chats import ChatStore

store = ChatStore(sys.argv[1])
chat = store.create_chat("tiny-llama")
store.append(chat.id, Message(role="user", content="written before the crash"))
call = ToolCall(id="c1", name="clock", arguments={})
store.append(chat.id, Message(role="assistant", tool_calls=(call,)), stats={"ttft_s": 0.1})
print(chat.id, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_append_is_durable_when_the_process_is_killed(db: Path) -> None:
    db.parent.mkdir(parents=True)
    child = subprocess.run(
        [sys.executable, "-c", CRASHING_CHILD, str(db)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    chat_id = child.stdout.strip()
    # The connection never closed, so the messages are still in the write-ahead log.
    assert db.with_name("chats.db-wal").exists()
    store, notice = open_chat_store(db)
    with store:
        assert notice is None
        messages = store.messages(chat_id)
        assert [m.content for m in messages] == ["written before the crash", ""]
        assert messages[1].tool_calls[0].name == "clock"
        assert store.entries(chat_id)[1].stats == {"ttft_s": 0.1}
        assert store.get_chat(chat_id).title == "written before the crash"


def test_chats_are_listed_newest_first(store: ChatStore) -> None:
    first = store.create_chat("a", title="First")
    second = store.create_chat("b", title="Second")
    third = store.create_chat("c", title="Third")
    assert [c.title for c in store.list_chats()] == ["Third", "Second", "First"]
    store.append(first.id, Message(role="user", content="back to the first"))
    listed = store.list_chats()
    assert [c.id for c in listed] == [first.id, third.id, second.id]
    assert listed[0].message_count == 1
    assert listed[0].updated_at >= listed[0].created_at


def test_messages_keep_their_order(store: ChatStore) -> None:
    chat = store.create_chat("m")
    for i in range(30):
        store.append(chat.id, Message(role="user" if i % 2 == 0 else "assistant", content=str(i)))
    assert [m.content for m in store.messages(chat.id)] == [str(i) for i in range(30)]


def test_auto_title_from_first_user_message(store: ChatStore) -> None:
    chat = store.create_chat("m")
    assert chat.title == DEFAULT_TITLE
    store.append(chat.id, Message(role="system", content="system prompt, not a title"))
    store.append(chat.id, Message(role="user", content="   \n  "))
    assert store.get_chat(chat.id).title == DEFAULT_TITLE
    text = "Explain  pipeline\nparallelism across three Macs with different memory sizes"
    store.append(chat.id, Message(role="user", content=text))
    title = store.get_chat(chat.id).title
    assert title == "Explain pipeline parallelism across…"
    store.append(chat.id, Message(role="user", content="a later question"))
    assert store.get_chat(chat.id).title == title
    named = store.create_chat("m", title="  My\tchat ")
    store.append(named.id, Message(role="user", content="does not rename it"))
    assert store.get_chat(named.id).title == "My chat"


def test_auto_title_cuts_long_words() -> None:
    assert auto_title("short") == "short"
    assert auto_title("x" * 100) == "x" * 40 + "…"
    assert auto_title("") is None


def test_rename_and_delete(db: Path, store: ChatStore) -> None:
    keep = store.create_chat("m")
    gone = store.create_chat("m")
    store.append(gone.id, Message(role="user", content="hi"))
    store.rename(keep.id, "  Renamed\nchat ")
    assert store.get_chat(keep.id).title == "Renamed chat"
    with pytest.raises(ValueError):
        store.rename(keep.id, "   ")
    store.delete(gone.id)
    assert [c.id for c in store.list_chats()] == [keep.id]
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT COUNT(*) FROM messages").fetchone() == (0,)
    for action in (
        lambda: store.delete(gone.id),
        lambda: store.rename(gone.id, "x"),
        lambda: store.messages(gone.id),
        lambda: store.get_chat(gone.id),
        lambda: store.append(gone.id, Message(role="user", content="x")),
    ):
        with pytest.raises(ChatNotFoundError):
            action()


def test_truncate_and_replace_last(store: ChatStore) -> None:
    chat = store.create_chat("m")
    for message in CONVERSATION:
        store.append(chat.id, message)
    regenerated = Message(role="assistant", content="391.")
    assert store.replace_last(chat.id, regenerated, stats={"decode_tps": 3.0}) == 4
    assert store.messages(chat.id)[-1] == regenerated
    assert store.entries(chat.id)[-1].stats == {"decode_tps": 3.0}
    assert store.truncate(chat.id, 2) == 3
    assert store.messages(chat.id) == CONVERSATION[:2]
    assert store.append(chat.id, regenerated) == 2
    assert store.truncate(chat.id, 0) == 3
    with pytest.raises(ChatStoreError):
        store.replace_last(chat.id, regenerated)
    with pytest.raises(ValueError):
        store.truncate(chat.id, -1)


def test_stats_that_are_not_json_write_nothing(store: ChatStore) -> None:
    chat = store.create_chat("m")
    with pytest.raises(TypeError):
        store.append(chat.id, Message(role="assistant", content="x"), stats={"when": object()})
    assert store.messages(chat.id) == []


def test_export_markdown(store: ChatStore) -> None:
    chat = store.create_chat("tiny-llama")
    for message in CONVERSATION:
        store.append(chat.id, message)
    store.append(chat.id, Message(role="user", content="Show code:\n```py\nprint(1)\n```"))
    text = store.export_markdown(chat.id)
    assert text.startswith("# What is 17 × 23? Answer in one line…\n")
    assert "Model: `tiny-llama`" in text
    assert "You are terse" not in text
    assert text.count("## User") == 2
    assert text.count("## Assistant") == 2
    assert "## Tool result `calculator`\n\n```\n391\n```" in text
    assert "<details>\n<summary>Reasoning</summary>\n\nI should use the calculator." in text
    assert "**Tool call** `calculator`\n\n```json\n{\n" in text
    assert '"expression": "17 * 23"' in text
    assert '"tags": [\n      "ü"\n    ]' in text
    assert "17 × 23 = **391**." in text
    assert "Show code:\n```py\nprint(1)\n```" in text
    assert text.index("## Tool result") < text.index("17 × 23 = **391**.")


def test_export_fences_outgrow_backticks_in_content() -> None:
    summary = store_summary()
    tool = Message(role="tool", content="```\nnested\n```", name="echo")
    text = render_markdown(summary, [tool])
    assert "````\n```\nnested\n```\n````" in text
    reasoning = Message(role="assistant", content="ok", reasoning="a </details> tag")
    assert "a &lt;/details> tag" in render_markdown(summary, [reasoning])


def store_summary() -> ChatSummary:
    with ChatStore(":memory:") as memory:
        return memory.create_chat("m", title="T")


@pytest.mark.parametrize(
    "content",
    [os.urandom(64 * 1024), b"this is a plain text file, not a database\n" * 10],
    ids=["random-bytes", "text-file"],
)
def test_unreadable_database_is_moved_aside(db: Path, content: bytes) -> None:
    db.parent.mkdir(parents=True)
    db.write_bytes(content)
    db.with_name("chats.db-wal").write_bytes(b"stale wal")
    with pytest.raises(UnreadableChatDatabase):
        ChatStore(db)

    store, notice = open_chat_store(db)
    with store:
        asides = list(db.parent.glob("chats.db.broken-*"))
        main = [p for p in asides if not p.name.endswith("-wal")]
        assert len(main) == 1
        aside = main[0]
        assert aside.read_bytes() == content
        assert aside.with_name(aside.name + "-wal").read_bytes() == b"stale wal"
        assert notice is not None
        assert notice.startswith(f"The chat database at {db} could not be read (")
        assert notice.endswith(f"; it was moved to {aside} and a new one started.")
        assert "not an SQLite database" in notice
        chat = store.create_chat("m")
        store.append(chat.id, Message(role="user", content="fresh start"))
    with ChatStore(db) as reopened:
        assert reopened.messages(chat.id)[0].content == "fresh start"


def test_damaged_pages_are_detected(db: Path, store: ChatStore) -> None:
    chat = store.create_chat("m")
    for i in range(200):
        store.append(chat.id, Message(role="user", content=f"{i} " + "x" * 500))
    store.close()
    with db.open("r+b") as file:
        file.seek(3 * 4096)
        file.write(os.urandom(2 * 4096))
    store2, notice = open_chat_store(db)
    with store2:
        assert notice is not None and notice.startswith(f"The chat database at {db} could not")
        assert store2.list_chats() == []
    assert len(list(db.parent.glob("chats.db.broken-*"))) == 1


def test_a_foreign_sqlite_file_is_not_taken_over(db: Path) -> None:
    db.parent.mkdir(parents=True)
    with sqlite3.connect(db) as raw:
        raw.execute("CREATE TABLE recipes (name TEXT)")
    store, notice = open_chat_store(db)
    with store:
        assert notice is not None and "not one of exo-tui's chats" in notice
        assert f"Move {db} away to start a new history." in notice
    # Healthy (it passes SQLite's integrity check): left where it is, as it is.
    assert list(db.parent.glob("chats.db.broken-*")) == []
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT name FROM sqlite_master").fetchone() == ("recipes",)


def test_migration_hook_runs_new_steps_once(db: Path, store: ChatStore) -> None:
    chat = store.create_chat("m")
    store.append(chat.id, Message(role="user", content="old"))
    store.close()
    runs: list[int] = []

    def add_pinned(conn: sqlite3.Connection) -> None:
        runs.append(1)
        conn.execute("ALTER TABLE chats ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0")

    newer = (*MIGRATIONS, add_pinned)
    with ChatStore(db, migrations=newer) as migrated:
        assert migrated.schema_version == len(newer)
        assert migrated.messages(chat.id)[0].content == "old"
    with ChatStore(db, migrations=newer):
        pass
    assert runs == [1]
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT pinned FROM chats").fetchone() == (0,)
        assert raw.execute("SELECT version FROM schema_version").fetchone() == (len(newer),)

    # This version does not know the newer schema: the file is kept aside, not overwritten.
    opened, notice = open_chat_store(db)
    with opened:
        assert notice is not None and "newer exo-tui" in notice
    assert list(db.parent.glob("chats.db.broken-*")) == []
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT version FROM schema_version").fetchone() == (len(newer),)


def test_a_failing_migration_changes_nothing(db: Path, store: ChatStore) -> None:
    store.close()

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("ALTER TABLE chats ADD COLUMN half INTEGER")
        raise RuntimeError("bug in a migration")

    with pytest.raises(RuntimeError):
        ChatStore(db, migrations=(*MIGRATIONS, broken))
    with sqlite3.connect(db) as raw:
        columns = [row[1] for row in raw.execute("PRAGMA table_info(chats)")]
        assert "half" not in columns
        assert raw.execute("SELECT version FROM schema_version").fetchone() == (len(MIGRATIONS),)


def test_concurrent_appends_from_two_threads(store: ChatStore) -> None:
    chat = store.create_chat("m")
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def writer(name: str) -> None:
        try:
            start.wait()
            for i in range(100):
                store.append(chat.id, Message(role="user", content=f"{name}-{i}"))
        except BaseException as error:  # surfaced by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    entries = store.entries(chat.id)
    assert [e.position for e in entries] == list(range(200))
    for name in ("a", "b"):
        mine = [e.message.content for e in entries if e.message.content.startswith(name)]
        assert mine == [f"{name}-{i}" for i in range(100)]
    assert store.get_chat(chat.id).message_count == 200


def test_an_unusable_location_falls_back_to_memory(tmp_path: Path) -> None:
    blocker = tmp_path / "data"
    blocker.write_text("a file where the data folder should be")
    store, notice = open_chat_store(blocker / "chats.db")
    with store:
        assert notice is not None
        assert notice.startswith(f"The chat database at {blocker / 'chats.db'} could not be opened")
        assert notice.endswith("chats will not be saved this session.")
        chat = store.create_chat("m")
        store.append(chat.id, Message(role="user", content="kept in memory"))
        assert store.messages(chat.id)[0].content == "kept in memory"
    assert blocker.read_text() == "a file where the data folder should be"


def test_search_finds_the_first_message_that_says_it_with_a_snippet(store: ChatStore) -> None:
    older = _chat("Older")
    store.append_turn(older, [Message(role="user", content="What is 100% of 5_000?")])
    newer = _chat("Newer")
    long = "word " * 20 + "the Needle is here " + "tail " * 20
    store.append_turn(
        newer,
        [
            Message(role="system", content="needle in the system prompt is not searched"),
            Message(role="user", content="no match"),
            Message(role="assistant", content=long),
            Message(role="user", content="needle again"),
        ],
    )
    matches = store.search("needle")
    assert [(m.chat_id, m.position) for m in matches] == [(newer.id, 2)]
    assert matches[0].snippet.startswith("…") and matches[0].snippet.endswith("…")
    assert "the Needle is here" in matches[0].snippet
    # LIKE's own wildcards are matched as text.
    assert [m.chat_id for m in store.search("100%")] == [older.id]
    assert store.search("5_0") and not store.search("5x0") and not store.search("0%o")
    assert store.search("   ") == []


def _chat(title: str) -> ChatSummary:
    from exo_tui.store.records import new_chat

    return new_chat("demo", title=title)


def test_a_turn_keeps_each_messages_stats(store: ChatStore) -> None:
    chat = _chat("Stats")
    turn = [Message(role="user", content="q"), Message(role="assistant", content="a")]
    store.append_turn(chat, turn, stats=[None, {"finish_reason": "length"}])
    assert [entry.stats for entry in store.entries(chat.id)] == [None, {"finish_reason": "length"}]
    store.append_turn(chat, [Message(role="assistant", content="b")], replace_from=1)
    assert [(e.message.content, e.stats) for e in store.entries(chat.id)] == [
        ("q", None),
        ("b", None),
    ]
    with pytest.raises(ValueError, match="3 stats for 1 messages"):
        store.append_turn(chat, turn[:1], stats=[None, None, None])
