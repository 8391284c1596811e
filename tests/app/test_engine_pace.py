"""The engine's thread keeps its pace beside the screen: full garbage collections stay out of
the stream (what lives long is frozen, and unfrozen again when much of it goes away), and the
GIL changes hands within a millisecond while the app runs."""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.mlx_threads import GIL_SWITCH_INTERVAL_S
from exo_tui.app import garbage
from exo_tui.app.main import ExoTuiApp
from tests.app.helpers import fixed_stats

pytestmark = pytest.mark.anyio


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()  # the rest of the test run collects as usual


def test_settled_objects_leave_collections_and_settling_again_frees_them() -> None:
    node = Node()
    alive = weakref.ref(node)
    garbage.settle()
    assert gc.get_freeze_count() > 0
    del node
    gc.collect()
    assert alive() is not None  # frozen: a collection does not walk it
    garbage.settle()
    assert alive() is None


async def test_the_app_settles_once_its_screen_is_up(tmp_path: Path) -> None:
    gc.unfreeze()
    app = ExoTuiApp(models_dirs=[tmp_path], chat_db=tmp_path / "chats.db", node_stats=fixed_stats())
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        # Textual's screen, styles and imported code: out of every later full collection.
        assert gc.get_freeze_count() > 10_000


async def test_the_gil_changes_hands_sooner_while_the_app_runs(tmp_path: Path) -> None:
    before = sys.getswitchinterval()
    app = ExoTuiApp(models_dirs=[tmp_path], chat_db=tmp_path / "chats.db", node_stats=fixed_stats())
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert sys.getswitchinterval() == pytest.approx(GIL_SWITCH_INTERVAL_S)
        assert before > GIL_SWITCH_INTERVAL_S
    assert sys.getswitchinterval() == pytest.approx(before)
