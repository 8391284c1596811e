"""Fixtures of the engine's tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def empty_hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Never scan the real Hugging Face cache: point it at an empty folder."""
    hub = tmp_path / "hf-hub"
    hub.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    return hub
