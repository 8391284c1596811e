"""The chats list asks before it deletes: Del names the chat and its messages, Del again deletes."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.app import App, ComposeResult
from textual.widgets import DataTable, Label, Static

from engine.types import Message
from exo_tui.app.screens.chats import ChatsScreen
from exo_tui.store.chats import ChatStore
from exo_tui.store.records import new_chat
from tests.app.helpers import wait_until


class ChatsHost(App[None]):
    def __init__(self, store: ChatStore, export_dir: Path) -> None:
        super().__init__()
        self.store = store
        self.export_dir = export_dir
        self.deleted: list[str] = []

    def compose(self) -> ComposeResult:
        yield Static("host")

    def on_mount(self) -> None:
        self.push_screen(ChatsScreen(self.store, self.export_dir))

    def on_chats_screen_deleted(self, message: ChatsScreen.Deleted) -> None:
        self.deleted.append(message.chat_id)


def confirm_text(app: App[None]) -> str:
    label = app.screen.query_one("#chats-confirm", Label)
    return str(label.render()) if label.display else ""


@pytest.mark.anyio
async def test_delete_asks_first_then_deletes(tmp_path: Path) -> None:
    with ChatStore(tmp_path / "chats.db") as store:
        older = new_chat("demo", title="Older chat")
        store.append_turn(older, [Message(role="user", content="hi")])
        newer = new_chat("demo", title="Trip plans")
        turn = [Message(role="user", content="a"), Message(role="assistant", content="b")]
        store.append_turn(newer, turn)
        app = ChatsHost(store, tmp_path / "exports")
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_until(pilot, lambda: isinstance(app.screen, ChatsScreen))
            table = app.screen.query_one(DataTable)
            assert table.row_count == 2
            first = store.list_chats()[0]

            await pilot.press("delete")
            await wait_until(pilot, lambda: "Del again deletes" in confirm_text(app))
            assert f"“{first.title}” ({first.message_count} messages)" in confirm_text(app)
            assert len(store.list_chats()) == 2

            await pilot.press("down")  # moving away takes the question back
            await wait_until(pilot, lambda: confirm_text(app) == "")
            await pilot.press("up", "delete")
            await wait_until(pilot, lambda: "Del again" in confirm_text(app))
            await pilot.press("delete")
            await wait_until(pilot, lambda: app.deleted == [first.id])
            assert [chat.id for chat in store.list_chats()] != [first.id]
            assert len(store.list_chats()) == 1
            assert table.row_count == 1
            assert confirm_text(app) == ""


def titles(app: App[None]) -> list[str]:
    table = app.screen.query_one(DataTable)
    return [str(table.get_row_at(i)[0]) for i in range(table.row_count)]


class OpeningHost(ChatsHost):
    def __init__(self, store: ChatStore, export_dir: Path) -> None:
        super().__init__(store, export_dir)
        self.opened: list[str | None] = []

    def on_mount(self) -> None:
        def opened(chat: object) -> None:
            self.opened.append(getattr(chat, "id", None))

        # After the first refresh, as the app pushes it from a key (pushed from on_mount, the
        # result of Enter never reached the callback).
        self.call_after_refresh(self.push_screen, ChatsScreen(self.store, self.export_dir), opened)


@pytest.mark.anyio
async def test_typing_filters_by_title_and_by_what_the_chats_say(tmp_path: Path) -> None:
    with ChatStore(tmp_path / "chats.db") as store:
        chats = {}
        for title, said in (
            ("Trip plans", "trains to Lyon"),
            ("Soup", "a recipe with LENTILS"),
            ("Lentil prices", "how much"),
            ("Other", "nothing here"),
        ):
            chats[title] = chat = new_chat("demo", title=title)
            store.append_turn(chat, [Message(role="user", content=said)])
        app = OpeningHost(store, tmp_path / "exports")
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_until(pilot, lambda: isinstance(app.screen, ChatsScreen))
            assert len(titles(app)) == 4
            await pilot.press(*"lentil")
            # The title match first, then the chat whose message says it (any case).
            await wait_until(pilot, lambda: titles(app) == ["Lentil prices", "Soup"])
            await pilot.press("backspace", *"ls")
            await wait_until(pilot, lambda: titles(app) == ["Soup"])
            await pilot.press(*"zz")
            await wait_until(pilot, lambda: titles(app) == [])
            label = app.screen.query_one("#chats-filter", Label)
            assert "no chat says it" in str(label.render())
            await pilot.press("escape")  # Esc takes the filter back, the list stays open
            await wait_until(pilot, lambda: len(titles(app)) == 4)
            await pilot.press(*"lyon", "enter")  # Enter opens the top match
            await wait_until(pilot, lambda: app.opened == [chats["Trip plans"].id])
