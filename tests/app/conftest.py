"""App test fixtures: every test gets its own exo-tui home and Hugging Face cache."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def exo_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Config, data, chats and the Hugging Face cache all in a temporary folder."""
    home = tmp_path / "exo-home"
    monkeypatch.setenv("EXO_TUI_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    return home


@pytest.fixture
def models_dir(tiny_llama: Path, tmp_path: Path) -> Path:
    """A models folder holding a copy of the tiny llama."""
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copytree(tiny_llama, folder / "tiny-llama")
    return folder
