"""The open chat in the app: deleting it starts a new one; a refused send keeps its text."""

from __future__ import annotations

from pathlib import Path

import pytest

from exo_tui.app.screens.chats import ChatsScreen
from exo_tui.app.widgets.chat import StatsLine, UserMessage
from exo_tui.app.widgets.prompt import PromptInput
from tests.app.helpers import HeldBackend, wait_until
from tests.app.test_app import SIZE, launch, make_app

pytestmark = pytest.mark.anyio


async def test_deleting_the_open_chat_then_sending_starts_a_new_chat(models_dir: Path) -> None:
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await launch(app, pilot)
        await pilot.click(PromptInput)
        await pilot.press(*"Hello", "enter")
        await wait_until(pilot, lambda: bool(app.query(StatsLine)))
        store, chat = app.conversation.store, app.conversation.summary
        assert store is not None and chat is not None
        await wait_until(pilot, lambda: any(c.id == chat.id for c in store.list_chats()))

        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: isinstance(app.screen, ChatsScreen))
        await pilot.press("delete", "delete")
        await wait_until(pilot, lambda: not store.list_chats())
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, ChatsScreen))
        assert not app.query(UserMessage)  # the deleted chat is off the screen

        await pilot.click(PromptInput)
        await pilot.press(*"Again", "enter")
        await wait_until(pilot, lambda: bool(app.query(StatsLine)))
        assert app.is_running
        again = app.conversation.summary
        assert again is not None and again.id != chat.id
        await wait_until(pilot, lambda: [c.id for c in store.list_chats()] == [again.id])
        assert [m.content for m in store.messages(again.id) if m.role == "user"] == ["Again"]


async def test_a_send_refused_without_a_model_keeps_the_text(models_dir: Path) -> None:
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.selection.card is not None)
        prompt = app.query_one(PromptInput)
        await pilot.click(PromptInput)
        await pilot.press(*"hello", "enter")
        await wait_until(
            pilot, lambda: any("Launch a model first" in n.message for n in app._notifications)
        )
        await wait_until(pilot, lambda: prompt.text == "hello")
        assert not app.query(UserMessage)


async def test_a_send_refused_while_answering_keeps_the_text(models_dir: Path) -> None:
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await launch(app, pilot)
        assert app.conversation.backend is not None
        held = HeldBackend(app.conversation.backend)
        app.conversation.backend = held  # type: ignore[assignment]
        prompt = app.query_one(PromptInput)
        await pilot.click(PromptInput)
        await pilot.press(*"first", "enter")
        await wait_until(pilot, lambda: app.conversation.generating and bool(held.requests))
        await pilot.press(*"second", "enter")
        await wait_until(
            pilot, lambda: any("Still answering" in n.message for n in app._notifications)
        )
        await wait_until(pilot, lambda: prompt.text == "second")
        assert [m.text for m in app.query(UserMessage)] == ["first"]
        held.go.set()
        await wait_until(pilot, lambda: not app.conversation.generating)
        assert prompt.text == "second"


async def test_the_last_chat_reopens_on_start_and_is_marked_in_the_list(
    models_dir: Path, exo_home: Path
) -> None:
    from textual.widgets import DataTable

    from engine.types import Message
    from exo_tui.store.chats import ChatStore
    from exo_tui.store.records import new_chat

    db = exo_home / "data" / "chats.db"
    db.parent.mkdir(parents=True)
    with ChatStore(db) as store:
        for title, question in (("Older", "first question"), ("Latest", "last question")):
            chat = new_chat("tiny-llama", title=title)
            turn = [Message(role="user", content=question), Message(role="assistant", content="ok")]
            store.append_turn(chat, turn)
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: bool(app.query(UserMessage)))
        assert "last question" in str(app.query_one(UserMessage).render())
        assert app.conversation.summary is not None
        assert app.conversation.summary.title == "Latest"
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: isinstance(app.screen, ChatsScreen))
        table = app.screen.query_one(DataTable)
        titles = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
        assert titles == ["● Latest", "Older"]


async def test_f4_copies_the_last_code_block(models_dir: Path, exo_home: Path) -> None:
    from engine.types import Message
    from exo_tui.app.widgets.chat import AnswerView
    from exo_tui.store.chats import ChatStore
    from exo_tui.store.records import new_chat

    answer = (
        "Two ways:\n\n```sh\nls -la\n```\n\nor\n\n```python\nimport os\nprint(os.listdir())\n```\n"
    )
    db = exo_home / "data" / "chats.db"
    db.parent.mkdir(parents=True)
    with ChatStore(db) as store:
        turn = [
            Message(role="user", content="list files"),
            Message(role="assistant", content=answer),
        ]
        store.append_turn(new_chat("tiny-llama", title="Files"), turn)
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: bool(app.query(AnswerView)))
        await pilot.press("f4")
        await wait_until(pilot, lambda: app.clipboard == "import os\nprint(os.listdir())")
        assert any(
            "Copied the last code block of 2 (2 lines)" in n.message for n in app._notifications
        )
        await pilot.press("f4")  # again: the one before it
        await wait_until(pilot, lambda: app.clipboard == "ls -la")
        assert any("Copied code block 1 of 2 (1 line)" in n.message for n in app._notifications)
        await pilot.press("f4")  # and round to the last
        await wait_until(pilot, lambda: app.clipboard == "import os\nprint(os.listdir())")
