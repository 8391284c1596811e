"""App test fixtures: every test gets its own exo-tui home and Hugging Face cache."""

from __future__ import annotations

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
