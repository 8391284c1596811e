"""The picker's filter: the highlight follows the best match; Enter takes the highlighted row."""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Static

from exo_tui.app.screens.model_picker import ModelPicker, PickerEntry
from tests.app.helpers import wait_until
from tests.cards import tiny_card


def entry(name: str) -> PickerEntry:
    card = tiny_card(name=name, path=f"/models/{name}")
    return PickerEntry(card=card, fits=True, fit_note="fits (pipeline)")


ENTRIES = [entry("m1b-4bit"), entry("qwen-m1b"), entry("m1b"), entry("demo")]


class PickerHost(App[None]):
    def __init__(self, selected: str | None) -> None:
        super().__init__()
        self.selected = selected
        self.picked: list[str | None] = []

    def compose(self) -> ComposeResult:
        yield Static("host")

    def on_mount(self) -> None:
        def picked(choice: PickerEntry | None) -> None:
            self.picked.append(choice.card.name if choice else None)

        self.push_screen(ModelPicker(ENTRIES, selected=self.selected), picked)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("typed", "chosen"),
    [("m1b", "m1b"), ("m1b-", "m1b-4bit"), ("qwen", "qwen-m1b"), ("", "m1b-4bit")],
)
async def test_enter_takes_the_top_match_of_the_filter(typed: str, chosen: str) -> None:
    app = PickerHost(selected="m1b-4bit")  # the current model is highlighted before any filter
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: isinstance(app.screen, ModelPicker))
        if typed:
            await pilot.press(*typed)
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.picked == [chosen])


@pytest.mark.anyio
async def test_down_after_filtering_moves_from_the_top_match() -> None:
    app = PickerHost(selected=None)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: isinstance(app.screen, ModelPicker))
        await pilot.press("m", "1", "b", "down", "enter")
        await wait_until(pilot, lambda: app.picked == ["m1b-4bit"])
