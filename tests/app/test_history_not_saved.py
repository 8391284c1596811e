"""The app on a full disk: the turn stays on screen and in memory, the user is told why, and
it is saved whole once there is room again."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from exo_tui.app.main import ExoTuiApp
from exo_tui.app.widgets.chat import StatsLine
from exo_tui.app.widgets.prompt import PromptInput
from exo_tui.cluster.control.state import RunnerReady
from tests.app.helpers import fixed_stats, wait_until

pytestmark = pytest.mark.anyio


def _fill(disk: Path) -> Path:
    filler = disk / "filler"
    try:
        with filler.open("wb") as file:
            while True:
                file.write(b"\0" * 4096)
                file.flush()
    except OSError:  # full
        return filler


def _notices(app: ExoTuiApp) -> list[str]:
    return [n.message for n in app._notifications]


async def test_a_full_disk_keeps_the_turn_and_saves_it_later(
    models_dir: Path, small_disk: Path
) -> None:
    db = small_disk / "chats.db"
    app = ExoTuiApp(
        model="tiny-llama",
        models_dirs=[models_dir],
        node_stats=fixed_stats(),
        bundled=False,
        chat_db=db,
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.selection.card is not None)
        await pilot.press("ctrl+l")
        await wait_until(
            pilot,
            lambda: (
                app.conversation.backend is not None
                and isinstance(app.state.nodes[0].runner, RunnerReady)
            ),
        )
        filler = _fill(small_disk)
        await pilot.click(PromptInput)
        await pilot.press(*"Hello there")
        await pilot.press("enter")
        await wait_until(pilot, lambda: bool(app.query(StatsLine)))

        def refused() -> list[str]:
            return [n for n in _notices(app) if "History could not be saved" in n]

        await wait_until(pilot, lambda: bool(refused()))
        (notice,) = refused()
        assert "the disk is full" in notice and str(small_disk) in notice
        assert app.is_running
        assert [m.role for m in app.conversation.messages] == ["system", "user", "assistant"]
        with sqlite3.connect(db) as raw:  # nothing of the turn, not half of it
            assert raw.execute("SELECT COUNT(*) FROM messages").fetchone() == (0,)
        filler.unlink()
        await wait_until(pilot, lambda: "History is saved again." in _notices(app), timeout=30)
        with sqlite3.connect(db) as raw:
            rows = raw.execute("SELECT role, content FROM messages ORDER BY position").fetchall()
        assert rows == [(m.role, m.content) for m in app.conversation.messages]
