"""Choose the nodes to place on: every online node with its free memory, ticked in ring order."""

from __future__ import annotations

from collections.abc import Sequence

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, SelectionList

from exo_tui.app.keys import shown
from exo_tui.cluster.control.state import NodeView

GB = 1e9

# What the screen gives back: the chosen ids in ring order, None for "every online node", or
# the screen's own Cancelled marker when the user backed out.
Cancelled = ()


class NodesScreen(ModalScreen[tuple[str, ...] | None]):
    """Tick nodes (Space), apply (Enter); all of them in the usual order means every online
    node, now and later."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="nodes.cancel"),
        Binding("enter", "apply", "Apply", id="nodes.apply", priority=True),
        Binding("a", "all", "All", id="nodes.all"),
    ]

    def __init__(self, nodes: Sequence[NodeView], chosen: Sequence[str] | None) -> None:
        super().__init__()
        self._views = [n for n in nodes if n.online]
        self._chosen = list(chosen) if chosen is not None else [n.node_id for n in self._views]

    def compose(self) -> ComposeResult:
        with Vertical(id="nodes-chooser"):
            every, apply, cancel = (
                shown(f"nodes.{name}", self.BINDINGS) for name in ("all", "apply", "cancel")
            )
            yield Label(
                f"Place on these nodes  [dim](Space ticks, {every} ticks all, {apply} applies, "
                f"{cancel} cancels; ring order is the order ticked)[/]"
            )
            yield SelectionList[str](id="nodes-list")

    def on_mount(self) -> None:
        options = self.query_one("#nodes-list", SelectionList)
        for node in self._views:
            free = node.stats.memory_available_bytes / GB
            label = (
                f"{node.name}  {node.stats.backend} · {free:.1f} GB free  [dim]{node.node_id}[/]"
            )
            options.add_option((label, node.node_id, node.node_id in self._chosen))
        options.highlighted = 0 if self._views else None
        options.focus()

    @on(SelectionList.SelectedChanged)
    def _ticked(self, event: SelectionList.SelectedChanged[str]) -> None:
        selected = set(event.selection_list.selected)
        # Keep the order of ticking: the ring follows it.
        self._chosen = [i for i in self._chosen if i in selected]
        self._chosen += [i for i in event.selection_list.selected if i not in self._chosen]

    def action_all(self) -> None:
        self.query_one("#nodes-list", SelectionList).select_all()

    def action_apply(self) -> None:
        if not self._chosen:
            self.notify("Tick at least one node (Space).", severity="warning")
            return
        # Every node in the usual order means "every online node", including those that join.
        every = self._chosen == [n.node_id for n in self._views]
        self.dismiss(None if every else tuple(self._chosen))

    def action_cancel(self) -> None:
        self.dismiss(Cancelled)
