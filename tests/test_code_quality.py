"""The code stays typed and tidy: ruff over the tree, pyright strict on engine/ and the cluster."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    found = BIN / name
    if found.exists():
        return str(found)
    located = shutil.which(name)
    if located is None:
        pytest.fail(f"{name} is not installed; run `make test` (it installs the dev extra)")
    return located


def test_ruff_is_clean() -> None:
    result = subprocess.run(
        [tool("ruff"), "check", "."], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_pyright_is_clean() -> None:
    result = subprocess.run(
        [tool("pyright"), "engine", "exo_tui"],  # strict where pyproject says so
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr
    assert "0 errors" in result.stdout
