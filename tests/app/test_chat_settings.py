"""Per-chat settings: a system prompt, temperature (with presets) and max tokens, kept with the
chat and used by its turns; an answer cut at the cap says so and names the key that lifts it."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Input, Label, RadioButton

from exo_tui.app.conversation import SYSTEM_PROMPT
from exo_tui.app.screens.chat_settings import ChatSettingsScreen, parse_settings
from exo_tui.app.widgets.chat import StatsLine
from exo_tui.app.widgets.prompt import PromptInput
from exo_tui.store.records import ChatSettings
from tests.app.helpers import HeldBackend, wait_until
from tests.app.test_app import SIZE, launch, make_app

pytestmark = pytest.mark.anyio


def test_parse_settings_names_what_is_wrong_and_keeps_the_default_prompt_as_none() -> None:
    assert parse_settings(SYSTEM_PROMPT, "0.7", "2,048", SYSTEM_PROMPT) == ChatSettings(
        temperature=0.7, max_tokens=2048
    )
    assert parse_settings(" Be terse. ", "0", "5", SYSTEM_PROMPT) == ChatSettings(
        system_prompt="Be terse.", temperature=0.0, max_tokens=5
    )
    hot = parse_settings("", "hot", "5", SYSTEM_PROMPT)
    assert isinstance(hot, str) and "Temperature must be a number from 0 to 2" in hot
    assert "'hot'" in hot
    assert "Max tokens must be a whole number" in str(parse_settings("", "1", "0", SYSTEM_PROMPT))
    assert "Temperature" in str(parse_settings("", "2.5", "9", SYSTEM_PROMPT))


async def test_settings_are_used_by_the_turns_and_kept_with_the_chat(models_dir: Path) -> None:
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await launch(app, pilot)
        assert app.conversation.backend is not None
        recorder = HeldBackend(app.conversation.backend, held=False)
        app.conversation.backend = recorder  # type: ignore[assignment]

        await pilot.press("ctrl+f")
        await wait_until(pilot, lambda: isinstance(app.screen, ChatSettingsScreen))
        dialog = app.screen
        dialog.query_one("#settings-temperature", Input).value = "hot"
        await pilot.press("ctrl+s")
        error = dialog.query_one("#settings-error", Label)
        await wait_until(pilot, lambda: "Temperature must be a number" in str(error.render()))
        assert app.screen is dialog  # a bad value keeps the dialog, and says why

        balanced = next(b for b in dialog.query(RadioButton) if b.name == "balanced")
        await pilot.click(balanced)
        temperature = dialog.query_one("#settings-temperature", Input)
        await wait_until(pilot, lambda: temperature.value == "0.7")
        dialog.query_one("#settings-system", Input).value = "Answer in French."
        dialog.query_one("#settings-max-tokens", Input).value = "4"
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: not isinstance(app.screen, ChatSettingsScreen))

        await pilot.click(PromptInput)
        await pilot.press(*"Hello", "enter")
        await wait_until(
            pilot, lambda: bool(app.query(StatsLine)) and not app.conversation.generating
        )
        request = recorder.requests[0]
        assert request.temperature == 0.7 and request.max_tokens == 4
        assert request.messages[0].content == "Answer in French."
        line = str(app.query_one(StatsLine).render())
        assert "stopped at the 4-token cap (Ctrl+F raises it)" in line
        chat = app.conversation.summary
        store = app.conversation.store
        assert chat is not None and store is not None
        await wait_until(pilot, lambda: any(c.id == chat.id for c in store.list_chats()))
        assert store.get_chat(chat.id).settings == ChatSettings(
            system_prompt="Answer in French.", temperature=0.7, max_tokens=4
        )

        # Changed on a chat the store holds: kept there, its opening prompt too.
        await pilot.press("ctrl+f")
        await wait_until(pilot, lambda: isinstance(app.screen, ChatSettingsScreen))
        app.screen.query_one("#settings-system", Input).value = "Answer in German."
        await pilot.press("enter")  # Enter in a field saves as well
        await wait_until(pilot, lambda: not isinstance(app.screen, ChatSettingsScreen))
        assert store.get_chat(chat.id).settings.system_prompt == "Answer in German."
        assert store.messages(chat.id)[0].content == "Answer in German."

        await pilot.press("ctrl+n")  # a new chat starts from the defaults
        assert app.conversation.settings == ChatSettings()

    again = make_app(models_dir)
    async with again.run_test(size=SIZE) as pilot:  # the chat reopens with its settings
        await wait_until(pilot, lambda: again.conversation.summary is not None)
        assert again.conversation.settings.system_prompt == "Answer in German."
        assert again.conversation.settings.temperature == 0.7


async def test_a_preset_is_chosen_from_the_keyboard(models_dir: Path) -> None:
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+f")
        await wait_until(pilot, lambda: isinstance(app.screen, ChatSettingsScreen))
        temperature = app.screen.query_one("#settings-temperature", Input)
        await pilot.press("shift+tab")  # from the system prompt, up to the presets
        await pilot.press("down", "down", "enter")  # exact, precise, balanced
        await wait_until(pilot, lambda: temperature.value == "0.7")
        await pilot.press("down", "enter")
        await wait_until(pilot, lambda: temperature.value == "1")
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: not isinstance(app.screen, ChatSettingsScreen))
        assert app.conversation.settings.temperature == 1.0
