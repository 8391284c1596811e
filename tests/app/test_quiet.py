"""Panels redraw only what changed: an equal text or an equal key does not update a Static."""

from __future__ import annotations

import pytest
from rich.text import Text
from textual.app import App, ComposeResult
from textual.widgets import Static

from exo_tui.app.widgets import quiet

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
