"""Chat history when the disk is full, a lock is held too long, or the file is not the user's.

Real SQLite on a real full filesystem (a small tmpfs), a lock held by another process, and a
database left by root opened by a process that has dropped to another user.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.types import Message, ToolCall
from exo_tui.store.chat_errors import ChatWriteError
from exo_tui.store.chats import ChatStore
from exo_tui.store.opening import open_chat_store
from exo_tui.store.records import new_chat

ROOT = Path(__file__).resolve().parents[2]

TURN = [
    Message(role="user", content="What is 17 * 23? " + "u" * 6000),
    Message(
        role="assistant",
        content="",
        tool_calls=(ToolCall(id="c1", name="calculator", arguments={"expression": "17 * 23"}),),
    ),
    Message(role="tool", content="391 " + "t" * 6000, tool_call_id="c1", name="calculator"),
    Message(role="assistant", content="17 * 23 = 391. " + "a" * 6000),
]


def _count(db: Path) -> int:
    with sqlite3.connect(db) as raw:
        return raw.execute("SELECT COUNT(*) FROM messages").fetchone()[0]


def _fill(disk: Path, leave: int) -> Path:
    """Fill `disk` until fewer than `leave` bytes are free; the filler file."""
    filler = disk / "filler"
    with filler.open("wb") as file:
        while shutil.disk_usage(disk).free > leave:
            try:
                file.write(b"\0" * 4096)
                file.flush()
            except OSError:
                break
    return filler


def test_a_full_disk_refuses_the_whole_turn_and_saves_it_later(small_disk: Path) -> None:
    db = small_disk / "chats.db"
    with ChatStore(db) as store:
        chat = new_chat("tiny-llama")
        store.append_turn(chat, [Message(role="user", content="before the disk filled")])
        filler = _fill(small_disk, leave=12 * 1024)  # room for part of the turn, not all
        with pytest.raises(ChatWriteError) as caught:
            store.append_turn(chat, TURN)
        error = caught.value
        assert error.reason == "the disk is full"
        assert f"Free some space on the disk that holds {small_disk}." in str(error)
        assert store.messages(chat.id) == [Message(role="user", content="before the disk filled")]
        filler.unlink()  # the user frees space: the same turn goes in whole
        assert store.append_turn(chat, TURN) == [1, 2, 3, 4]
        assert store.messages(chat.id)[1:] == TURN
    assert _count(db) == 5


LOCK_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
"""


def test_a_lock_held_too_long_refuses_the_turn_with_the_reason(tmp_path: Path) -> None:
    db = tmp_path / "chats.db"
    with ChatStore(db) as store:
        chat = new_chat("tiny-llama")
        holder = subprocess.Popen(
            [sys.executable, "-c", LOCK_HOLDER, str(db)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
            with pytest.raises(ChatWriteError) as caught:
                store.append_turn(chat, TURN)
            assert "another program has held a lock on it for more than 5 s" in str(caught.value)
            assert "Close the other exo-tui" in caught.value.fix
        finally:
            assert holder.stdin is not None
            holder.stdin.write("\n")
            holder.stdin.close()
            holder.wait(timeout=30)
        assert store.append_turn(chat, TURN) == [0, 1, 2, 3]
    assert _count(db) == 4


def test_close_checkpoints_the_log_into_the_file(tmp_path: Path) -> None:
    db = tmp_path / "chats.db"
    store = ChatStore(db)
    chat = new_chat("m")
    store.append_turn(chat, TURN)
    wal = db.with_name("chats.db-wal")
    assert wal.stat().st_size > 0
    # Another reader keeps SQLite from folding the log in on its own when the store closes.
    with sqlite3.connect(db) as reader:
        reader.execute("SELECT COUNT(*) FROM chats").fetchone()
        store.close()
        assert wal.stat().st_size == 0
    copy = tmp_path / "copy.db"
    shutil.copyfile(db, copy)  # the main file alone, as a backup would take it
    with sqlite3.connect(copy) as raw:
        assert raw.execute("SELECT COUNT(*) FROM messages").fetchone() == (4,)


AS_OTHER_USER = """
import json, os, sys
from pathlib import Path
from engine.types import Message
from exo_tui.store.chat_errors import ChatWriteError
from exo_tui.store.opening import open_chat_store
from exo_tui.store.records import new_chat

db = Path(sys.argv[1])
if os.geteuid() == 0:  # become someone who is not the file's owner, as after `sudo exo-tui`
    os.setgid(65534)
    os.setuid(65534)
store, notice = open_chat_store(db)
chats = store.list_chats()
result = {
    "notice": notice,
    "read_only": store.read_only,
    "titles": [c.title for c in chats],
    "messages": [m.content for m in store.messages(chats[0].id)] if chats else [],
}
try:
    store.append_turn(new_chat("m"), [Message(role="user", content="x")])
    result["write"] = "written"
except ChatWriteError as error:
    result["write"] = str(error)
store.close()
print(json.dumps(result))
"""


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder another user can reach (pytest's own tmp folders are root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="exo-not-yours-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


@pytest.mark.parametrize("folder_writable", [True, False], ids=["own-folder", "root-folder"])
def test_a_healthy_database_the_user_cannot_write_is_read_only(
    shared_dir: Path, folder_writable: bool
) -> None:
    data = shared_dir / "data"
    data.mkdir()
    db = data / "chats.db"
    with ChatStore(db) as store:  # as root: `sudo exo-tui`
        chat = new_chat("tiny-llama")
        store.append_turn(chat, [Message(role="user", content="asked as root")])
    if os.geteuid() == 0:
        if folder_writable:
            os.chown(data, 65534, 65534)
    else:  # not root: take the write permission away from ourselves instead
        db.chmod(0o444)
        if not folder_writable:
            data.chmod(0o555)
    before = db.read_bytes()
    child = subprocess.run(
        [sys.executable, "-c", AS_OTHER_USER, str(db)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    data.chmod(0o755)
    assert child.returncode == 0, child.stderr
    result = json.loads(child.stdout)
    assert result["read_only"] is True
    assert result["titles"] == ["asked as root"]
    assert result["messages"] == ["asked as root"]
    notice = result["notice"]
    assert notice.startswith(f"The chat database at {db} cannot be written: ")
    assert "shown read-only" in notice and str(data) in notice
    assert ("sudo chown -R " if os.geteuid() == 0 else "chmod u+w") in notice
    assert "the file is read-only" in result["write"]
    # Nothing moved aside, nothing written: the file is as root left it (in a folder of the
    # user's own, SQLite leaves an empty -wal and the -shm it reads the file through).
    assert db.read_bytes() == before
    assert not list(data.glob("chats.db.broken-*"))
    wal = db.with_name("chats.db-wal")
    assert not wal.exists() or wal.stat().st_size == 0
    store, notice = open_chat_store(db)
    with store:
        assert notice is None
        assert [m.content for m in store.messages(chat.id)] == ["asked as root"]


def test_an_unreadable_file_is_left_alone(shared_dir: Path) -> None:
    db = shared_dir / "chats.db"
    with ChatStore(db) as store:
        store.append_turn(new_chat("m"), [Message(role="user", content="private")])
    db.chmod(0o600)
    code = AS_OTHER_USER.replace("chats = store.list_chats()", "chats = []")
    child = subprocess.run(
        [sys.executable, "-c", code, str(db)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    if os.geteuid() != 0:
        pytest.skip("only another user is kept out of a 0600 file")
    assert child.returncode == 0, child.stderr
    result = json.loads(child.stdout)
    assert "could not be opened" in result["notice"] and "sudo chown -R" in result["notice"]
    assert not list(shared_dir.glob("chats.db.broken-*"))
    assert db.stat().st_size > 0
