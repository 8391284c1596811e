"""Arrows point one way: `engine` imports nothing of exo_tui; nothing headless imports Textual."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BLOCK_AND_IMPORT = """
import importlib, sys

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError(f"{{name}} must not be imported here")
        return None

sys.meta_path.insert(0, Blocker())
for module in {modules!r}:
    importlib.import_module(module)
print("ok")
"""


def modules_of(package: str) -> list[str]:
    folder = ROOT / package.replace(".", "/")
    found = [package]
    for info in pkgutil.walk_packages([str(folder)], prefix=package + "."):
        if ".demo." not in info.name:
            found.append(info.name)
    return found


def import_without(blocked: set[str], modules: list[str]) -> subprocess.CompletedProcess[str]:
    code = BLOCK_AND_IMPORT.format(blocked=blocked, modules=modules)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def test_engine_imports_neither_textual_nor_exo_tui() -> None:
    modules = modules_of("engine")
    assert "engine.generate" in modules and "engine.loading" in modules
    result = import_without({"textual", "exo_tui"}, modules)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def headless_modules() -> list[str]:
    """Every exo_tui module outside the Textual app: the CLI, the commands, the chat turn, the hub,
    the cluster and the store, found by walking the package (a new package is covered at once)."""
    found = [name for name in modules_of("exo_tui") if not name.startswith("exo_tui.app")]
    return found


def test_nothing_headless_imports_textual() -> None:
    modules = headless_modules()
    for package in ("exo_tui.commands", "exo_tui.chat", "exo_tui.hub", "exo_tui.cluster"):
        assert package in modules, f"{package} is not walked"
    result = import_without({"textual"}, modules)
    assert result.returncode == 0, result.stderr


def test_the_blocker_really_blocks() -> None:
    result = import_without({"textual"}, ["exo_tui.app.main"])
    assert result.returncode != 0
    assert "textual must not be imported here" in result.stderr
