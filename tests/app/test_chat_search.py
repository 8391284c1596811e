"""Search across chats: the chats list finds text in any message, shows it, and opens the chat."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import DataTable

from engine.types import Message
from exo_tui.app.screens.chats import ChatsScreen
from exo_tui.app.widgets.chat import UserMessage
from exo_tui.store.chats import ChatStore
from exo_tui.store.records import new_chat
from tests.app.helpers import wait_until
from tests.app.test_app import SIZE, make_app

pytestmark = pytest.mark.anyio


async def test_a_word_from_an_old_answer_finds_its_chat_with_a_snippet_and_opens_it(
    models_dir: Path, exo_home: Path
) -> None:
    db = exo_home / "data" / "chats.db"
    db.parent.mkdir(parents=True)
    with ChatStore(db) as store:
        for title, question, answer in (
            ("Bread", "how long to bake?", "About forty minutes at 220 degrees, then let it rest."),
            ("Latest", "anything else?", "No."),
        ):
            turn = [
                Message(role="user", content=question),
                Message(role="assistant", content=answer),
            ]
            store.append_turn(new_chat("tiny-llama", title=title), turn)
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: bool(app.query(UserMessage)))  # "Latest" reopened
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: isinstance(app.screen, ChatsScreen))
        table = app.screen.query_one(DataTable)
        await pilot.press(*"Degrees")
        await wait_until(pilot, lambda: table.row_count == 1)
        title, found, *_ = (str(cell) for cell in table.get_row_at(0))
        assert title == "Bread"
        assert "minutes at 220 degrees, then" in found
        await pilot.press("enter")
        await wait_until(pilot, lambda: not isinstance(app.screen, ChatsScreen))
        await wait_until(
            pilot, lambda: "how long to bake?" in str(app.query_one(UserMessage).render())
        )
        assert app.conversation.summary is not None
        assert app.conversation.summary.title == "Bread"
