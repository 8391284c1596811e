"""Answering again: regenerate the last answer, or edit the last message and send it again."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.binding import Binding
from textual.widgets import TextArea

from exo_tui.app.bindings import CHAT_BINDINGS
from exo_tui.app.keymap import binding_scopes
from exo_tui.app.main import ExoTuiApp
from exo_tui.app.widgets.chat import AnswerView, StatsLine, UserMessage
from exo_tui.app.widgets.prompt import PromptInput
from tests.app.helpers import HeldBackend, wait_until
from tests.app.test_app import SIZE, launch, make_app

pytestmark = pytest.mark.anyio


def stored_roles(app: ExoTuiApp) -> list[tuple[str, str]]:
    store, chat = app.conversation.store, app.conversation.summary
    assert store is not None and chat is not None
    return [(m.role, m.content) for m in store.messages(chat.id)]


def answered(app: ExoTuiApp, tokens: int) -> bool:
    lines = [str(line.render()) for line in app.query(StatsLine)]
    return not app.conversation.generating and any(f"+{tokens} tokens" in x for x in lines)


async def test_regenerate_replaces_the_last_answer_on_screen_and_in_the_store(
    models_dir: Path,
) -> None:
    app = make_app(models_dir)
    app.conversation.max_tokens = 3
    async with app.run_test(size=SIZE) as pilot:
        await launch(app, pilot)
        await pilot.click(PromptInput)
        await pilot.press(*"Hello", "enter")
        await wait_until(pilot, lambda: answered(app, 3))
        await wait_until(pilot, lambda: len(stored_roles(app)) == 3)
        first = app.query_one(AnswerView)

        app.conversation.max_tokens = 6  # a longer answer tells the new one from the old
        await pilot.press("ctrl+g")
        await wait_until(pilot, lambda: answered(app, 6))
        assert any("At temperature 0" in n.message for n in app._notifications)
        assert first not in app.query(AnswerView)
        assert len(app.query(AnswerView)) == 1 and len(app.query(UserMessage)) == 1
        assert len(app.query(StatsLine)) == 1
        assert [m.role for m in app.conversation.messages] == ["system", "user", "assistant"]
        new_answer = app.conversation.messages[-1].content
        await wait_until(pilot, lambda: stored_roles(app)[-1] == ("assistant", new_answer))
        assert [role for role, _ in stored_roles(app)] == ["system", "user", "assistant"]


async def test_regenerate_is_refused_while_answering_and_with_nothing_asked(
    models_dir: Path,
) -> None:
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await launch(app, pilot)
        await pilot.press("ctrl+g")
        await wait_until(
            pilot, lambda: any("Nothing to answer again" in n.message for n in app._notifications)
        )
        assert app.conversation.backend is not None
        held = HeldBackend(app.conversation.backend)
        app.conversation.backend = held  # type: ignore[assignment]
        await pilot.click(PromptInput)
        await pilot.press(*"Hello", "enter")
        await wait_until(pilot, lambda: bool(app.query(AnswerView)) and app.conversation.generating)
        answer = app.query_one(AnswerView)
        await pilot.press("ctrl+g")
        await wait_until(
            pilot, lambda: any("Stop the answer first" in n.message for n in app._notifications)
        )
        held.go.set()
        await pilot.press("escape")
        await wait_until(pilot, lambda: not app.conversation.generating)
        assert list(app.query(AnswerView)) == [answer]


async def test_the_chat_keys_are_in_the_palette_and_help(models_dir: Path) -> None:
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.selection.card is not None)
        titles = [command.title for command in app.get_system_commands(app.screen)]
        assert {"Regenerate (Ctrl+G)", "Edit last message (F8)"} <= set(titles)
        ids = {b.id for b in binding_scopes()["main screen"]}
        assert {"chat.regenerate", "chat.edit_last"} <= ids


def test_no_chat_key_is_one_the_prompt_keeps_for_itself() -> None:
    # The prompt has the focus, and a TextArea's own keys come before the screen's.
    taken = {
        key.strip()
        for binding in TextArea.BINDINGS
        if isinstance(binding, Binding)
        for key in binding.key.split(",")
    }
    assert taken and not {key for b in CHAT_BINDINGS for key in b.key.split(",")} & taken


async def test_edit_the_last_message_and_send_it_again(models_dir: Path) -> None:
    app = make_app(models_dir)
    app.conversation.max_tokens = 3
    async with app.run_test(size=SIZE) as pilot:
        await launch(app, pilot)
        await pilot.click(PromptInput)
        await pilot.press(*"First", "enter")
        await wait_until(pilot, lambda: answered(app, 3))
        await pilot.press(*"Secnd", "enter")
        await wait_until(pilot, lambda: len(app.query(StatsLine)) == 2 and answered(app, 3))
        await wait_until(pilot, lambda: len(stored_roles(app)) == 5)

        prompt = app.query_one(PromptInput)
        await pilot.press("f8")
        await wait_until(pilot, lambda: prompt.text == "Secnd")
        assert str(prompt.border_title) == "Enter replaces your last message · F8 cancels"
        await pilot.press("end", "backspace", "backspace", *"ond", "enter")
        await wait_until(pilot, lambda: answered(app, 3) and len(app.query(StatsLine)) == 2)
        users = [str(u.render()) for u in app.query(UserMessage)]
        assert users == ["First", "Second"]
        assert len(app.query(AnswerView)) == 2
        assert not prompt.border_title
        expected = ["system", "user", "assistant", "user", "assistant"]
        assert [m.role for m in app.conversation.messages] == expected
        await wait_until(
            pilot, lambda: [c for r, c in stored_roles(app) if r == "user"] == ["First", "Second"]
        )
        assert [role for role, _ in stored_roles(app)] == expected

        # F8 twice: the prompt is a plain one again, and the next send is a new turn.
        await pilot.press("f8")
        await wait_until(pilot, lambda: prompt.text == "Second")
        await pilot.press("f8")
        await wait_until(pilot, lambda: prompt.text == "" and not prompt.border_title)
        await pilot.press(*"Third", "enter")
        await wait_until(pilot, lambda: len(app.query(StatsLine)) == 3 and answered(app, 3))
        assert [str(u.render()) for u in app.query(UserMessage)] == ["First", "Second", "Third"]


async def test_the_chat_keys_follow_the_keymap(models_dir: Path, exo_home: Path) -> None:
    (exo_home / "config").mkdir(parents=True)
    (exo_home / "config" / "keys.toml").write_text('[keys]\n"chat.regenerate" = "f12"\n')
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await launch(app, pilot)
        titles = [command.title for command in app.get_system_commands(app.screen)]
        assert "Regenerate (F12)" in titles
        await pilot.press("f12")
        await wait_until(
            pilot, lambda: any("Nothing to answer again" in n.message for n in app._notifications)
        )
