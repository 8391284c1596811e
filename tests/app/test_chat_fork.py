"""Forking a chat: edit an earlier message, and sending starts a new chat (a branch) from there;
the chat it forks from is kept, Ctrl+R shows both, and the branch's answer starts from the
prompt cache."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, OptionList
from textual.widgets._footer import FooterKey  # pyright: ignore[reportPrivateUsage]

from engine.generate import next_turn_prefix
from engine.types import ChatRequest
from exo_tui.app.keymap import binding_scopes
from exo_tui.app.main import ExoTuiApp
from exo_tui.app.screens.chats import ChatsScreen, as_tree
from exo_tui.app.screens.fork_from import ForkFromScreen
from exo_tui.app.widgets.chat import StatsLine, UserMessage
from exo_tui.app.widgets.prompt import PromptInput
from exo_tui.chat.backend import LocalBackend
from exo_tui.store.records import new_chat
from tests.app.helpers import wait_until
from tests.app.test_app import SIZE, launch, make_app
from tests.app.test_chat_redo import answered

pytestmark = pytest.mark.anyio


async def three_turns(app: ExoTuiApp, pilot: Pilot[None]) -> str:
    """Ask three questions; the chat's id once the store holds all of it."""
    await launch(app, pilot)
    await pilot.click(PromptInput)
    for n, question in enumerate(("First", "Second", "Third"), start=1):
        await pilot.press(*question, "enter")
        await wait_until(pilot, lambda n=n: len(app.query(StatsLine)) == n and answered(app, 3))
    store, chat = app.conversation.store, app.conversation.summary
    assert store is not None and chat is not None
    await wait_until(pilot, lambda: len(store.messages(chat.id)) == 7)
    return chat.id


async def fork_at_second(app: ExoTuiApp, pilot: Pilot[None]) -> None:
    """F9, the second message picked (the list is newest first), edited and sent."""
    await pilot.press("f9")
    await wait_until(pilot, lambda: isinstance(app.screen, ForkFromScreen))
    options = app.screen.query_one(OptionList)
    shown = [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]
    assert shown == [" 3. Third", " 2. Second", " 1. First"]
    await pilot.press("down", "enter")
    prompt = app.query_one(PromptInput)
    await wait_until(pilot, lambda: prompt.text == "Second")
    assert str(prompt.border_title) == "Enter forks a new chat · F9 cancels"
    await pilot.press("end", *" edited", "enter")


async def test_a_fork_is_a_new_chat_and_the_old_one_is_kept(models_dir: Path) -> None:
    app = make_app(models_dir)
    app.conversation.max_tokens = 3
    async with app.run_test(size=SIZE) as pilot:
        parent_id = await three_turns(app, pilot)
        store = app.conversation.store
        assert store is not None
        before = store.entries(parent_id)

        await fork_at_second(app, pilot)
        await wait_until(pilot, lambda: answered(app, 3) and len(app.query(StatsLine)) == 2)
        branch = app.conversation.summary
        assert branch is not None and branch.id != parent_id
        assert (branch.parent_id, branch.fork_position) == (parent_id, 3)
        # On screen: the messages before the one edited (their stats lines too), then the edit.
        assert [str(u.render()) for u in app.query(UserMessage)] == ["First", "Second edited"]
        assert not app.query_one(PromptInput).border_title

        await wait_until(pilot, lambda: len(store.messages(branch.id)) == 5)
        entries = store.entries(branch.id)
        assert [e.message for e in entries[:3]] == [e.message for e in before[:3]]
        assert entries[2].stats == before[2].stats  # the first answer keeps its stats line
        assert [(e.message.role, e.message.content) for e in entries[3:4]] == [
            ("user", "Second edited")
        ]
        assert entries[4].message.role == "assistant"
        stored = store.get_chat(branch.id)
        assert (stored.parent_id, stored.fork_position) == (parent_id, 3)
        assert store.entries(parent_id) == before  # the chat forked from is unchanged

        # Ctrl+R: the branch sits under its parent, marked, and the filter still finds it.
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: isinstance(app.screen, ChatsScreen))
        table = app.screen.query_one(DataTable)
        titles = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
        assert titles == ["First", "● ⑂ Second edited"]
        await pilot.press(*"edited")
        await wait_until(pilot, lambda: table.row_count == 1)
        assert str(table.get_row_at(0)[0]) == "● ⑂ Second edited · from First"
        await pilot.press("escape", "escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, ChatsScreen))


async def test_the_fork_key_cancels_an_edit_and_says_when_there_is_nothing_to_fork(
    models_dir: Path,
) -> None:
    app = make_app(models_dir)
    app.conversation.max_tokens = 3
    async with app.run_test(size=SIZE) as pilot:
        await launch(app, pilot)
        titles = [command.title for command in app.get_system_commands(app.screen)]
        assert "Fork from a message (F9)" in titles
        assert "chat.fork" in {b.id for b in binding_scopes()["main screen"]}  # so in Help
        await pilot.press("f9")
        await wait_until(
            pilot, lambda: any("No message to fork from" in n.message for n in app._notifications)
        )
        await pilot.click(PromptInput)
        await pilot.press(*"First", "enter")
        await wait_until(pilot, lambda: answered(app, 3))
        await pilot.press("f9")
        await wait_until(pilot, lambda: isinstance(app.screen, ForkFromScreen))
        await pilot.press("escape")  # cancelled: nothing changes
        await wait_until(pilot, lambda: not isinstance(app.screen, ForkFromScreen))
        prompt = app.query_one(PromptInput)
        assert prompt.text == "" and app.conversation.editing is None
        await pilot.press("f9", "enter")
        await wait_until(pilot, lambda: prompt.text == "First")
        await pilot.press("f9")  # again: the edit is given up, the next send a plain turn
        await wait_until(pilot, lambda: prompt.text == "" and not prompt.border_title)
        chat = app.conversation.summary
        await pilot.press(*"Next", "enter")
        await wait_until(pilot, lambda: len(app.query(StatsLine)) == 2 and answered(app, 3))
        assert app.conversation.summary is chat


@pytest.mark.parametrize("cold", [False, True], ids=["warm", "reopened"])
async def test_the_fork_starts_from_the_prompt_cache(models_dir: Path, cold: bool) -> None:
    """Warm: the cache holds the chat forked from. Reopened: a new chat emptied the cache, and
    the chat is opened again from the store; the fork prefills its history as the edit starts."""
    app = make_app(models_dir)
    app.conversation.max_tokens = 3
    async with app.run_test(size=SIZE) as pilot:
        parent_id = await three_turns(app, pilot)
        backend = app.conversation.backend
        assert isinstance(backend, LocalBackend)
        loaded = backend.loaded
        tools = app.conversation.tools.specs
        history = ChatRequest(messages=tuple(app.conversation.messages[:3]), tools=tools)
        shared = next_turn_prefix(loaded, history)  # what the fork has in common with it
        if cold:
            await pilot.press("ctrl+n")
            await wait_until(pilot, lambda: len(loaded.prompt_cache) == 0)
            await pilot.press("ctrl+r")
            await wait_until(pilot, lambda: isinstance(app.screen, ChatsScreen))
            await pilot.press("enter")
            summary = app.conversation.summary
            await wait_until(pilot, lambda: summary is not None and summary.id == parent_id)
            assert loaded.prompt_cache.reusable(shared) == 0
        await pilot.press("f9")
        await wait_until(pilot, lambda: isinstance(app.screen, ForkFromScreen))
        await pilot.press("down", "enter")
        await wait_until(pilot, lambda: app.query_one(PromptInput).text == "Second")
        # The history before the message is in the cache before the user has typed a key.
        await wait_until(pilot, lambda: loaded.prompt_cache.reusable(shared) >= len(shared) - 1)
        await pilot.press("end", *" edited", "enter")
        await wait_until(pilot, lambda: answered(app, 3) and len(app.query(StatsLine)) == 2)
        done = app.query(StatsLine).last().done
        assert done.usage.cached_tokens >= len(shared) - 1 > 0
        assert f"({done.usage.cached_tokens} cached)" in str(app.query(StatsLine).last().render())


def test_branches_sit_under_the_chat_they_fork_from_at_any_depth() -> None:
    root, other = new_chat("m", "root"), new_chat("m", "other")
    branch = new_chat("m", "branch", fork_of=(root.id, 1))
    deeper = new_chat("m", "deeper", fork_of=(branch.id, 3))
    orphan = new_chat("m", "orphan", fork_of=("not listed", 1))
    # The store lists the latest first: the branches may come before their parents.
    rows = as_tree([deeper, other, branch, orphan, root])
    assert [(chat.title, depth) for chat, depth in rows] == [
        ("other", 0),
        ("orphan", 0),
        ("root", 0),
        ("branch", 1),
        ("deeper", 2),
    ]


async def test_the_fork_key_keeps_out_of_the_footer_at_80_by_24(models_dir: Path) -> None:
    app = make_app(models_dir)
    async with app.run_test(size=(80, 24)) as pilot:

        def shown() -> list[str]:  # laid out: a key not yet placed has no width
            return [key.key for key in app.screen.query(FooterKey) if key.region.width > 0]

        await wait_until(pilot, lambda: "ctrl+l" in shown())
        keys = shown()
        newcomer = [key for key in keys if key in ("f1", "ctrl+o", "ctrl+l")]
        assert newcomer == ["f1", "ctrl+o", "ctrl+l"]
        assert keys.index("ctrl+l") < 4  # right after Quit: none of the chat's keys before
        assert "f9" not in keys
        placed = [key for key in app.screen.query(FooterKey) if key.region.width > 0]
        assert all(key.description for key in placed)  # every key says what it does (Esc: Stop)
        stop = [key.description for key in app.screen.query(FooterKey) if key.key == "escape"]
        assert stop == ["Stop"]
