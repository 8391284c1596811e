"""Update a Static only when what it shows changes.

`Static.update` always asks for a new layout of the whole screen, which costs ~20 ms here, and
the panels are told about every cluster event (each node's stats, every second): redrawing only
what changed keeps the screen's work, and the engine's share of the CPU, where they belong.
"""

from __future__ import annotations

from collections.abc import Hashable
from weakref import WeakKeyDictionary

from rich.text import Text
from textual.visual import VisualType
from textual.widgets import Static

_shown: WeakKeyDictionary[Static, Hashable] = WeakKeyDictionary()


def text_key(text: Text | str) -> Hashable:
    """What a piece of text looks like: its characters and styles."""
    if isinstance(text, str):
        return text
    return (text.plain, str(text.style), tuple((s.start, s.end, str(s.style)) for s in text.spans))


def show(static: Static, content: VisualType, key: Hashable | None = None) -> None:
    """`static.update(content)` unless it already shows content with the same `key` (by default
    the text's own look; other content needs a key)."""
    if key is None:
        assert isinstance(content, Text | str), "pass a key for content other than text"
        key = text_key(content)
    if _shown.get(static) == key:
        return
    _shown[static] = key
    static.update(content)
