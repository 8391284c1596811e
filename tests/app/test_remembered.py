"""What the app remembers between runs (the theme), and the one rule for switching chats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exo_tui.app.screens.chats import ChatsScreen
from exo_tui.app.widgets.prompt import PromptInput
from exo_tui.store.settings import Settings, load_settings, save_settings
from tests.app.helpers import wait_until
from tests.app.test_app import SIZE, launch, make_app

pytestmark = pytest.mark.anyio


async def test_the_theme_is_remembered_on_restart(models_dir: Path, exo_home: Path) -> None:
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.theme != "nord"
        app.theme = "nord"
        await pilot.pause()
    saved = json.loads((exo_home / "config" / "settings.json").read_text())
    assert saved["theme"] == "nord"
    again = make_app(models_dir)
    async with again.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert again.theme == "nord"


async def test_a_broken_settings_file_gives_the_default_theme(
    models_dir: Path, exo_home: Path
) -> None:
    (exo_home / "config").mkdir(parents=True)
    (exo_home / "config" / "settings.json").write_text('{"theme": ')
    assert load_settings() == Settings()
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.is_running and app.theme == "textual-dark"


def test_settings_are_written_whole_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    save_settings(Settings(theme="not-a-theme"), path)
    assert load_settings(path).theme == "not-a-theme"


async def test_the_chats_list_waits_like_a_new_chat_while_answering(models_dir: Path) -> None:
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await launch(app, pilot)
        app.conversation.set_generating(True)  # an answer in progress
        await pilot.press("ctrl+r")
        await wait_until(
            pilot, lambda: any("Stop the answer first" in n.message for n in app._notifications)
        )
        assert not isinstance(app.screen, ChatsScreen)
        app.conversation.set_generating(False)
        await pilot.click(PromptInput)
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: isinstance(app.screen, ChatsScreen))
