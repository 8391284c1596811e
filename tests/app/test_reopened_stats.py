"""A reopened chat shows the stats lines its answers had, and a turn cut off by quitting says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from exo_tui.app.widgets.chat import AnswerView, StatsLine
from exo_tui.app.widgets.prompt import PromptInput
from tests.app.helpers import HeldBackend, wait_until
from tests.app.test_app import SIZE, launch, make_app
from tests.app.test_chat_redo import answered

pytestmark = pytest.mark.anyio


async def test_a_reopened_chat_has_its_stats_lines_and_marks_a_turn_stopped_by_quitting(
    models_dir: Path,
) -> None:
    app = make_app(models_dir)
    app.conversation.max_tokens = 3
    async with app.run_test(size=SIZE) as pilot:
        await launch(app, pilot)
        await pilot.click(PromptInput)
        await pilot.press(*"Hello", "enter")
        await wait_until(pilot, lambda: answered(app, 3))
        live = str(app.query_one(StatsLine).render())
        assert app.conversation.backend is not None
        app.conversation.backend = HeldBackend(app.conversation.backend)  # type: ignore[assignment]
        await pilot.press(*"And then?", "enter")
        await wait_until(pilot, lambda: len(app.query(AnswerView)) == 2)
        assert app.conversation.generating
    # The app quit while the second answer had not begun (a long prefill, say).

    again = make_app(models_dir)
    async with again.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: len(again.query(StatsLine)) == 2)
        first, second = again.query(StatsLine)
        assert str(first.render()) == live
        assert not first.has_class("-cancelled")
        assert "cancelled" in str(second.render()) and second.has_class("-cancelled")
