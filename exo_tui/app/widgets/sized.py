"""A widget that takes the size a layout gives it without asking for one more layout."""

from __future__ import annotations

from typing import Self

from textual.geometry import Region, Size


class SizedByTheLayout:
    """Takes the size a layout gives it without asking for one more layout.

    When a layout changes a widget's size, Textual sets its virtual size through a reactive
    that lays out the whole screen again, though the layout that ran has placed (and anchored)
    everything at the new sizes already: each streamed append to an answer cost two layouts
    and two repaints of the same region (a scrollbar that shows or hides still asks for one,
    through its own reactive). The conversation's widgets skip the second.

    Nor before it is mounted: a Markdown block gets its content, and asks for a layout, before
    it is mounted; mounting lays it out, and the layout it asked for ran once more after that.

    A plain mixin: a Widget subclass would carry Textual's per-class attributes and shadow those
    of the widget it is mixed into.
    """

    def refresh(
        self, *regions: Region, repaint: bool = True, layout: bool = False, recompose: bool = False
    ) -> Self:
        mounted: bool = self.is_mounted  # type: ignore[attr-defined]
        refreshed: Self = super().refresh(  # type: ignore[misc]
            *regions, repaint=repaint, layout=layout and mounted, recompose=recompose
        )
        return refreshed

    def _size_updated(
        self, size: Size, virtual_size: Size, container_size: Size, layout: bool = True
    ) -> bool:
        updated: bool = super()._size_updated(  # type: ignore[misc]
            size, virtual_size, container_size, layout=False
        )
        return updated
