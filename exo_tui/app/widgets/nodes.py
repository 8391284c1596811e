"""The nodes panel: one card per node with live memory, BLAS, models on disk and runner state."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import ProgressBar, Static

from engine.kv_memory import format_bytes
from exo_tui.app.widgets import quiet
from exo_tui.cluster.control.state import (
    ClusterState,
    NodeStats,
    NodeView,
    RunnerDownloading,
    RunnerFailed,
    RunnerGenerating,
    RunnerIdle,
    RunnerLoading,
    RunnerReady,
)

BAR_WIDTH = 20


def memory_bar(used: int, total: int, width: int = BAR_WIDTH) -> Text:
    share = used / total if total else 0.0
    filled = round(share * width)
    style = "red" if share > 0.9 else "yellow" if share > 0.75 else "green"
    return Text.assemble(
        ("█" * filled, style),
        ("░" * (width - filled), "dim"),
        f" {format_bytes(used)} / {format_bytes(total)}",
    )


def runner_text(node: NodeView) -> Text:
    if not node.online:
        return Text("offline", style="red")
    match node.runner:
        case RunnerIdle():
            return Text("idle", style="dim")
        case RunnerDownloading(model=model, progress=fetched):
            done, total = fetched.bytes_done, fetched.bytes_total
            landing = (
                f": {fetched.file}"
                if fetched.file and fetched.files_done < fetched.files_total
                else ""
            )
            files = f"{fetched.files_done}/{fetched.files_total} files{landing}"
            amount = f"{format_bytes(done)} / {format_bytes(total)}"
            return Text(f"downloading {model} {amount}, {files}", style="cyan")
        case RunnerLoading(model=model, layers_loaded=done, layers_total=total):
            return Text(f"loading {model} {done}/{total}", style="yellow")
        case RunnerReady(model=model):
            return Text(f"ready: {model}", style="green")
        case RunnerGenerating(model=model):
            return Text(f"generating: {model}", style="bold green")
        case RunnerFailed(reason=reason):
            return Text(f"failed: {reason}", style="bold red")


class NodeCard(Vertical):
    """One node. The bar shows only while its files download or its layers load."""

    def __init__(self, node: NodeView) -> None:
        super().__init__(classes="node-card")
        self.node = node

    def compose(self) -> ComposeResult:
        yield Static(id="node-text")
        # A total from the start: without one the bar is indeterminate and animates 15 times a
        # second even while hidden, a redraw of the screen each time.
        yield ProgressBar(total=1, show_eta=False, id="node-load")

    def on_mount(self) -> None:
        self.show(self.node)

    def show(self, node: NodeView) -> None:
        self.node = node
        stats = node.stats
        text = Text.assemble(
            (stats.name, "bold"),
            f"  {backend_text(stats)} · {stats.blas.split(' ', 1)[0]}\n",
            memory_bar(stats.memory_used_bytes, stats.memory_total_bytes),
            f"\n{len(stats.models)} model{'s' if len(stats.models) != 1 else ''} on disk · ",
            runner_text(node),
        )
        quiet.show(self.query_one("#node-text", Static), text)
        bar = self.query_one("#node-load", ProgressBar)
        match node.runner:
            case RunnerLoading(layers_loaded=done, layers_total=total):
                progress: tuple[int, int] | None = (done, total)
            case RunnerDownloading(progress=fetched):
                progress = (fetched.bytes_done, fetched.bytes_total)
            case _:
                progress = None
        if bar.display != (progress is not None):
            bar.display = progress is not None
        if progress is not None:
            bar.update(total=max(progress[1], 1), progress=progress[0])


class NodesPanel(VerticalScroll):
    """Every node of the cluster, in the order first seen; any number of them."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.border_title = "Nodes"

    def show(self, state: ClusterState) -> None:
        cards = {card.node.node_id: card for card in self.query(NodeCard)}
        for node in state.nodes:
            card = cards.pop(node.node_id, None)
            if card is None:
                self.mount(NodeCard(node))
            elif card.is_mounted and card.children:
                card.show(node)
            else:  # still mounting: it shows its node when it mounts, so give it the latest
                card.node = node
        for gone in cards.values():
            gone.remove()
        foreign = self.query_one("#foreign", Static) if self.query("#foreign") else None
        if state.foreign:
            lines = Text("\n").join(
                Text.assemble(
                    ("⊘ ", "red"),
                    (f.name, "bold"),
                    f" {f.host}" if f.name != f.host else "",
                    f" ×{f.count}" if f.count > 1 else "",
                    f"  refused: {f.reason}",
                    style="dim",
                )
                for f in state.foreign
            )
            if foreign is None:
                self.mount(Static(lines, id="foreign"))
            else:
                quiet.show(foreign, lines)
        elif foreign is not None:
            foreign.remove()
        self.border_subtitle = f"{len(state.online_nodes)} online" + (
            f" · {len(state.foreign)} foreign" if state.foreign else ""
        )


def backend_text(stats: NodeStats) -> str:
    """`cpu avx512` where the CPU kernels run (engine/kernels), else the backend alone."""
    kernels = stats.kernels.split(" ", 1)[0]
    return stats.backend if kernels == "mlx" else f"{stats.backend} {kernels}"
