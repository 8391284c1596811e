"""Panels redraw only what changed: an equal text or an equal key does not update a Static."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from rich.text import Text
from textual.app import App, ComposeResult
from textual.widgets import Static

from exo_tui.app.main import ExoTuiApp
from exo_tui.app.widgets import quiet
from exo_tui.cluster.control.state import NodeStats
from tests.app.helpers import fixed_stats, wait_until

pytestmark = pytest.mark.anyio


class Counting(Static):
    updates = 0

    def update(self, content: object = "", *, layout: bool = True) -> None:  # type: ignore[override]
        self.updates += 1
        super().update(content, layout=layout)  # type: ignore[arg-type]


class One(App[None]):
    def compose(self) -> ComposeResult:
        yield Counting()


async def test_equal_content_does_not_redraw_and_a_change_does() -> None:
    app = One()
    async with app.run_test():
        static = app.query_one(Counting)
        quiet.show(static, Text("12.0 GB", style="green"))
        quiet.show(static, Text("12.0 GB", style="green"))
        assert static.updates == 1
        quiet.show(static, Text("12.0 GB", style="red"))  # same characters, another look
        quiet.show(static, Text("11.9 GB", style="red"))
        assert static.updates == 3
        quiet.show(static, Text("a table"), key=("table", 1))
        quiet.show(static, Text("a table"), key=("table", 1))
        assert static.updates == 4


async def test_an_idle_app_animates_nothing(tmp_path: Path) -> None:
    # A hidden progress bar without a total animated: a timer 15 times a second for nothing.
    app = ExoTuiApp(models_dirs=[tmp_path], chat_db=tmp_path / "chats.db", node_stats=fixed_stats())
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert [w for w in app.screen.walk_children() if w.auto_refresh] == []


async def test_an_idle_app_lays_nothing_out_as_each_seconds_stats_come(models_dir: Path) -> None:
    # The chat's hint was set again at every cluster event: the whole screen laid out, each
    # second, at a cost that grows with the chat (and holds back a streamed answer).
    reads = 0
    stats = fixed_stats()

    def counted(models: Sequence[str]) -> NodeStats:
        nonlocal reads
        reads += 1
        return stats(models)

    app = ExoTuiApp(model="tiny-llama", models_dirs=[models_dir], node_stats=counted, bundled=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.selection.card is not None and reads >= 3)
        await pilot.pause()
        layouts = 0
        screen = app.screen
        refresh_layout = screen._refresh_layout  # pyright: ignore[reportPrivateUsage]

        def counting(*args: Any, **kwargs: Any) -> None:
            nonlocal layouts
            layouts += 1
            refresh_layout(*args, **kwargs)

        screen._refresh_layout = counting  # type: ignore[method-assign]
        settled = reads
        await wait_until(pilot, lambda: reads >= settled + 3)
        await pilot.pause()
        assert layouts == 0
