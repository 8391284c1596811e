"""The house stays readable: modules and classes within limits, imports one way, no cycle."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "house.py"
spec = importlib.util.spec_from_file_location("house", SCRIPT)
assert spec is not None and spec.loader is not None
house = importlib.util.module_from_spec(spec)
sys.modules["house"] = house
spec.loader.exec_module(house)


def test_no_module_is_over_the_limit() -> None:
    counts = house.line_counts()
    assert "exo_tui.cli" in counts and "engine.generate" in counts
    over = {name: n for name, n in counts.items() if n > house.MAX_MODULE_LINES}
    assert not over, f"split these modules by job: {over}"


def test_no_class_has_too_many_methods() -> None:
    counts = house.method_counts()
    assert counts, "no class found: the walk is broken"
    over = {name: n for name, n in counts.items() if n > house.MAX_CLASS_METHODS}
    assert not over, f"these classes do too many jobs: {over}"


def test_no_import_cycle() -> None:
    cycles = house.import_cycles()
    assert not cycles, f"modules that import one another: {cycles}"


def test_every_import_follows_the_layers() -> None:
    violations = house.layer_violations()
    assert not violations, f"imports against ARCHITECTURE.md's arrows: {violations}"


def test_an_upward_import_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    graph = {"exo_tui.hub.fetch": {"exo_tui.app.main"}, "exo_tui.app.main": {"exo_tui.hub.fetch"}}
    monkeypatch.setattr(house, "import_graph", lambda: graph)
    assert house.layer_violations() == [("exo_tui.hub.fetch", "exo_tui.app.main")]


def test_a_cycle_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    monkeypatch.setattr(house, "import_graph", lambda: graph)
    assert house.import_cycles() == [["a", "b", "c"]]
