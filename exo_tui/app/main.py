"""The Textual app; for now one screen: this node and the models it can run."""

from __future__ import annotations

from pathlib import Path

import psutil
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Header, Static

from engine import blas
from engine.models import find_models
from engine.types import ModelCard


class ExoTuiApp(App[None]):
    TITLE = "exo-tui"
    BINDINGS = [Binding("q", "quit", "Quit", id="quit")]

    def __init__(self, model: str | None = None, models_dirs: list[Path] | None = None) -> None:
        super().__init__()
        self._preselected = model
        self._models_dirs = models_dirs

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="node")
        yield DataTable(id="models", cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#models", DataTable)
        table.add_columns("model", "source", "type", "layers", "size", "weights")
        cards: list[ModelCard] = find_models(self._models_dirs)
        for card in cards:
            weights = f"{card.quantization.bits}-bit" if card.quantization else (card.dtype or "?")
            table.add_row(
                card.name,
                card.source,
                card.model_type,
                str(card.num_layers),
                f"{card.bytes_on_disk / 1e6:.1f} MB",
                weights,
                key=card.path,
            )
        self._refresh_node()
        self.set_interval(1.0, self._refresh_node)

    def _refresh_node(self) -> None:
        memory = psutil.virtual_memory()
        used = (memory.total - memory.available) / 2**30
        self.query_one("#node", Static).update(
            f"[b]this node[/b]  cpu  BLAS: {blas.describe()}  "
            f"memory {used:.1f} / {memory.total / 2**30:.1f} GiB"
        )


def run_app(model: str | None = None, models_dirs: list[Path] | None = None) -> int:
    ExoTuiApp(model=model, models_dirs=models_dirs).run()
    return 0
