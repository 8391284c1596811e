"""The shape of the house: the largest modules, the classes with the most methods, import cycles.

`python scripts/house.py` prints them; tests/test_house.py holds the limits.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "exo_tui")
MAX_MODULE_LINES = 600
MAX_CLASS_METHODS = 40
# What each layer may import (ARCHITECTURE.md draws it). `rate` and `untrusted` are small
# helpers every layer of exo_tui may use; `cli` may use everything.
SHARED = {"rate", "untrusted"}
LAYER_ARROWS: dict[str, set[str]] = {
    "engine": set(),
    "store": {"engine"},
    "hub": {"engine", "store"},
    "cluster": {"engine", "hub", "store"},
    "chat": {"engine", "hub", "store", "cluster"},
    "api": {"engine", "hub", "store", "cluster", "chat"},
    "commands": {"engine", "hub", "store", "cluster", "chat", "api"},
    "app": {"engine", "hub", "store", "cluster", "chat", "api"},
}


def module_files() -> Iterator[tuple[str, Path]]:
    """Every module of the packages, by dotted name; the demo model's corpus aside."""
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).with_suffix("")
            if "demo" in relative.parts:
                continue
            parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
            yield ".".join(parts), path


def line_counts() -> dict[str, int]:
    return {name: len(path.read_text().splitlines()) for name, path in module_files()}


def method_counts() -> dict[str, int]:
    counts: dict[str, int] = {}
    for name, path in module_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                methods = [
                    item
                    for item in node.body
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                ]
                counts[f"{name}.{node.name}"] = len(methods)
    return counts


def _imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules this module imports anywhere, at import time or in a function
    (an import inside a function is still an arrow); imports for the type checker only aside."""
    tree = ast.parse(path.read_text())
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    anchor = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {module for module in found if module in known and module != name}


def import_graph() -> dict[str, set[str]]:
    files = dict(module_files())
    known = set(files)
    return {name: _imported(name, path, known) for name, path in files.items()}


def layer_of(module: str) -> str:
    """`engine`, or the part of exo_tui a module belongs to (`app`, `cluster`, `cli`, ...)."""
    parts = module.split(".")
    return parts[0] if parts[0] == "engine" or len(parts) == 1 else parts[1]


def layer_violations() -> list[tuple[str, str]]:
    """Each import (importer, imported) that goes against the layers' arrows."""
    found: list[tuple[str, str]] = []
    for module, imported in import_graph().items():
        source = layer_of(module)
        allowed = LAYER_ARROWS.get(source)
        if allowed is None:  # the CLI and the shared helpers import what they need
            continue
        for target in sorted(imported):
            layer = layer_of(target)
            if (
                layer != source
                and layer not in allowed
                and not (source != "engine" and layer in SHARED)
            ):
                found.append((module, target))
    return found


def import_cycles() -> list[list[str]]:
    """Each strongly connected set of modules that import one another (Tarjan's algorithm)."""
    graph = import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            members: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                cycles.append(sorted(members))

    for node in graph:
        if node not in index:
            connect(node)
    return cycles


def main() -> None:
    lines = sorted(line_counts().items(), key=lambda item: -item[1])
    print("largest modules:")
    for name, count in lines[:8]:
        print(f"  {count:5d}  {name}")
    methods = sorted(method_counts().items(), key=lambda item: -item[1])
    print("classes with the most methods:")
    for name, count in methods[:5]:
        print(f"  {count:5d}  {name}")
    violations = layer_violations()
    print(f"imports against the layers' arrows: {len(violations)}")
    for importer, imported in violations:
        print(f"  {importer} -> {imported}")
    cycles = import_cycles()
    print(f"import cycles: {len(cycles)}")
    for cycle in cycles:
        print("  " + " <-> ".join(cycle))


if __name__ == "__main__":
    main()
