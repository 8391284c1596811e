"""Keys that arrive in one burst (a paste without bracketing, typing over SSH) reach the prompt
in order, Enter included; a bracketed paste stays text."""

from __future__ import annotations

import pytest
from textual import events

from exo_tui.app.widgets.prompt import PromptInput
from tests.app.helpers import wait_until
from tests.app.test_chat_widgets import SIZE, ChatApp


def burst(app: ChatApp, keys: str) -> None:
    """Queue every key at once, as the terminal driver does for one read, with no pause between."""
    for char in keys:
        if char == "\r":
            app.post_message(events.Key("enter", "\r"))
        else:
            app.post_message(events.Key(char, char))


@pytest.mark.anyio
@pytest.mark.parametrize(("keys", "sent", "left"), [("hello\r", "hello", ""), ("zz1\r", "zz1", "")])
async def test_a_burst_sends_every_key_before_enter(keys: str, sent: str, left: str) -> None:
    app = ChatApp()
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.query_one(PromptInput)
        burst(app, keys)
        await wait_until(pilot, lambda: app.submitted == [sent])
        await pilot.pause()
        assert prompt.text == left


@pytest.mark.anyio
async def test_keys_after_enter_in_one_burst_start_the_next_prompt() -> None:
    app = ChatApp()
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.query_one(PromptInput)
        burst(app, "one\rtwo")
        await wait_until(pilot, lambda: app.submitted == ["one"] and prompt.text == "two")


@pytest.mark.anyio
async def test_a_bracketed_paste_stays_one_paste() -> None:
    app = ChatApp()
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.query_one(PromptInput)
        app.post_message(events.Paste("first line\nsecond line\n"))
        await wait_until(pilot, lambda: "second line" in prompt.text)
        await pilot.pause()
        assert app.submitted == []
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.submitted == ["first line\nsecond line"])


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("keys", "text"),
    [
        (["a", "b", "c", "d", "backspace", "x"], "abcx"),
        (["a", "b", "c", "d", "backspace", "backspace", "x"], "abx"),
        (["a", "b", "c", "left", "x"], "abxc"),
        (["a", "b", "home", "x"], "xab"),
    ],
)
async def test_editing_keys_in_a_burst_land_in_order(keys: list[str], text: str) -> None:
    # Backspace and the arrows are the TextArea's bindings; they must not run after the
    # characters queued behind them.
    app = ChatApp()
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.query_one(PromptInput)
        for key in keys:
            app.post_message(events.Key(key, key if len(key) == 1 else None))
        await wait_until(pilot, lambda: len(prompt.text) == len(text))
        await pilot.pause()
        assert prompt.text == text
