"""A remapped key shows everywhere the old one did: hints, Help, the palette and the footer; and
the palette holds every action once, each with what it does."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from textual.widgets import DataTable, Static
from textual.widgets._footer import FooterKey  # pyright: ignore[reportPrivateUsage]

from exo_tui.app.screens.help import HelpScreen
from exo_tui.app.widgets.prompt import PromptInput
from tests.app.helpers import wait_until
from tests.app.test_app import SIZE, make_app

pytestmark = pytest.mark.anyio


def plain(app: object, selector: str) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(app.screen.query_one(selector, Static).content)  # type: ignore[attr-defined]
    return console.export_text()


async def test_a_remapped_launch_shows_its_new_key_everywhere(
    models_dir: Path, exo_home: Path
) -> None:
    (exo_home / "config").mkdir(parents=True)
    (exo_home / "config" / "keys.toml").write_text(
        '[keys]\n"app.launch" = "f5"\n"prompt.send" = "ctrl+enter,enter"\n'
    )
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.selection.card is not None)
        await wait_until(pilot, lambda: "F5 launches" in plain(app, "#launch-status"))
        assert "Ctrl+L" not in plain(app, "#launch-status")

        def footer() -> dict[str, str]:
            return {key.description: key.key for key in app.screen.query(FooterKey)}

        await wait_until(pilot, lambda: "Model" in footer())
        assert footer().get("Launch") == "f5"
        assert "Ctrl+Enter sends" in str(app.query_one(PromptInput).placeholder)

        titles = {c.title: c.help for c in app.get_system_commands(app.screen)}
        assert "Launch (F5)" in titles
        assert not any("Ctrl+L" in title for title in titles)

        await pilot.press("f1")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
        table = app.screen.query_one("#help-keys", DataTable)
        rows = [tuple(str(cell) for cell in table.get_row_at(i)) for i in range(table.row_count)]
        assert ("F5", "Launch", "app.launch") in rows
        assert ("Ctrl+Enter, Enter", "Send", "prompt.send") in rows
        assert any(row[2] == "download.confirm" for row in rows)  # the dialogs' ids are listed


async def test_the_palette_lists_every_action_once_with_what_it_does(models_dir: Path) -> None:
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.selection.card is not None)
        commands = list(app.get_system_commands(app.screen))
        titles = [c.title for c in commands]
        assert "Export chat (Ctrl+S)" in titles and "Copy answer (F3)" in titles
        assert sum(title.startswith("Quit") for title in titles) == 1
        for command in commands:
            assert not command.help.startswith("app."), command
        launch = next(c for c in commands if c.title.startswith("Launch"))
        assert launch.help == "Load the placement shown"
