"""SVG snapshots of the main screens (pytest-textual-snapshot); update with --snapshot-update."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot

from tests.app.scenes import SCENES, SIZE, scene_app


@pytest.fixture(scope="module")
def scene_models(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("scene-models")
    shutil.copytree(tiny_llama, folder / "tiny-llama")
    return folder


@pytest.mark.parametrize("name", list(SCENES))
def test_screen(name: str, scene_models: Path, snap_compare: Callable[..., bool]) -> None:
    app = scene_app(None if name == "empty" else scene_models)

    async def run_before(pilot: Pilot[None]) -> None:
        await SCENES[name](app, pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
