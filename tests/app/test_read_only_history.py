"""A chat database that cannot be written: the app shows it read-only and says so, and a
delete or rename it refuses is reported, not fatal."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from textual.widgets import DataTable

from engine.types import Message
from exo_tui.app.main import ExoTuiApp
from exo_tui.app.screens.chats import ChatsScreen
from exo_tui.app.widgets.chat import UserMessage
from exo_tui.store.chats import ChatStore
from exo_tui.store.records import new_chat
from tests.app.helpers import fixed_stats, wait_until

pytestmark = pytest.mark.anyio


@pytest.fixture
def read_only_view() -> Iterator[tuple[Path, Path]]:
    """A folder and a read-only bind mount of it (root only), unmounted after the test."""
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root")
    folder = Path(tempfile.mkdtemp(prefix="exo-rw-"))
    view = Path(tempfile.mkdtemp(prefix="exo-ro-"))
    subprocess.run(["mount", "--bind", str(folder), str(view)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=True)
        yield folder, view
    finally:
        subprocess.run(["umount", "-l", str(view)], check=True)
        view.rmdir()
        for file in folder.iterdir():
            file.unlink()
        folder.rmdir()


async def test_a_database_that_cannot_be_written_is_shown_read_only(
    models_dir: Path, read_only_view: tuple[Path, Path]
) -> None:
    folder, view = read_only_view
    with ChatStore(folder / "chats.db") as store:
        chat = new_chat("tiny-llama")
        store.append_turn(chat, [Message(role="user", content="Remember me")])
    before = (folder / "chats.db").read_bytes()
    db = view / "chats.db"
    app = ExoTuiApp(
        model="tiny-llama",
        models_dirs=[models_dir],
        node_stats=fixed_stats(),
        bundled=False,
        chat_db=db,
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        notices = [n.message for n in app._notifications]
        (notice,) = [n for n in notices if "cannot be written" in n]
        assert notice.startswith(f"The chat database at {db} cannot be written: ")
        assert "shown read-only" in notice and "chmod u+w, or remount" in notice
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: isinstance(app.screen, ChatsScreen))
        assert app.screen.query_one(DataTable).row_count == 1
        await pilot.press("delete", "delete")  # asked, then confirmed
        await wait_until(
            pilot, lambda: any("Could not delete" in n.message for n in app._notifications)
        )
        assert app.is_running
        assert app.screen.query_one(DataTable).row_count == 1
        await pilot.press("enter")
        await wait_until(pilot, lambda: bool(app.query(UserMessage)))
        assert "Remember me" in str(app.query_one(UserMessage).render())
    assert (folder / "chats.db").read_bytes() == before
    assert sorted(p.name for p in folder.iterdir()) == ["chats.db"]
