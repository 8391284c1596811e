"""A prompt longer than the model's context ends at once with an error that names the numbers
and the fix; the message goes back into the prompt, and the chat goes on (issue 19)."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.pilot import Pilot

from exo_tui.app.main import ExoTuiApp
from exo_tui.app.widgets.chat import AnswerView, ErrorLine, StatsLine, UserMessage
from exo_tui.app.widgets.prompt import PromptInput
from tests.app.helpers import wait_until
from tests.app.test_app import SIZE, launch, make_app

pytestmark = pytest.mark.anyio

TOO_LONG = "Tell me about the sea and the ships that sail on it. " * 400


async def send_too_long(app: ExoTuiApp, pilot: Pilot[None]) -> str:
    """Send TOO_LONG; the error the answer shows, once the turn has ended."""
    app.query_one(PromptInput).text = TOO_LONG
    await pilot.press("enter")
    await wait_until(pilot, lambda: bool(app.query(ErrorLine)), timeout=30)
    await wait_until(pilot, lambda: not app.conversation.generating)
    return app.query_one(ErrorLine).message


async def test_a_prompt_longer_than_the_context_says_so_and_the_chat_goes_on(
    models_dir: Path,
) -> None:
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await launch(app, pilot)
        prompt = app.query_one(PromptInput)
        await pilot.click(PromptInput)
        await pilot.press(*"Hi", "enter")
        await wait_until(pilot, lambda: bool(app.query(StatsLine)))
        await wait_until(pilot, lambda: not app.conversation.generating)
        before = list(app.conversation.messages)

        error = await send_too_long(app, pilot)
        assert "holds at most 2048" in error and "tokens" in error, error
        assert "Shorten the message or start a new chat" in error
        answer = app.query(AnswerView).last()
        assert "waiting for the model" not in str(answer.render())
        assert prompt.text == TOO_LONG.strip()  # kept, to shorten
        assert app.conversation.messages == before  # the next turn does not carry it

        prompt.text = "Hello again"
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(app.query(StatsLine)) == 2, timeout=30)
        assert [m.content for m in app.query(UserMessage)][-1] == "Hello again"
        store, chat = app.conversation.store, app.conversation.summary
        assert store is not None and chat is not None
        await wait_until(
            pilot, lambda: [m.role for m in store.messages(chat.id)].count("assistant") == 2
        )
        assert TOO_LONG.strip() not in [m.content for m in store.messages(chat.id)]


async def test_a_new_chat_whose_first_message_is_too_long_starts_with_the_next(
    models_dir: Path,
) -> None:
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await launch(app, pilot)
        prompt = app.query_one(PromptInput)
        await send_too_long(app, pilot)
        assert [m.role for m in app.conversation.messages] == ["system"]

        prompt.text = "Hi"
        await pilot.press("enter")
        await wait_until(pilot, lambda: bool(app.query(StatsLine)), timeout=30)
        store, chat = app.conversation.store, app.conversation.summary
        assert store is not None and chat is not None
        await wait_until(
            pilot,
            lambda: [m.role for m in store.messages(chat.id)] == ["system", "user", "assistant"],
        )
        assert store.messages(chat.id)[1].content == "Hi"
