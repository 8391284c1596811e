"""Arrows point one way: `engine` and `exo_tui.cluster` import with Textual unimportable."""

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


def test_cluster_layer_never_imports_textual() -> None:
    modules = modules_of("exo_tui.cluster") + ["exo_tui.headless", "exo_tui.cli"]
    result = import_without({"textual"}, modules)
    assert result.returncode == 0, result.stderr


def test_the_blocker_really_blocks() -> None:
    result = import_without({"textual"}, ["exo_tui.app.main"])
    assert result.returncode != 0
    assert "textual must not be imported here" in result.stderr
