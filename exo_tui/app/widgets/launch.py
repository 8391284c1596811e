"""The launch panel: the chosen model, the sharding strategy, and the placement preview."""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import RadioButton, RadioSet, Static

from engine.types import ModelCard
from exo_tui.app.screens.model_picker import describe
from exo_tui.cluster.placement import Placement, PlacementError, Shard, Strategy, format_bytes


def shard_table(shards: tuple[Shard, ...], names: Mapping[str, str]) -> Table:
    table = Table(box=None, pad_edge=False, expand=True, show_edge=False)
    table.add_column("node")
    table.add_column("layers")
    table.add_column("needs", justify="right")
    table.add_column("free", justify="right")
    for shard in shards:
        layers = f"{shard.start_layer}–{shard.end_layer - 1}" if shard.num_layers else "-"
        table.add_row(
            names.get(shard.node_id, shard.node_id),
            layers,
            format_bytes(shard.bytes_needed),
            Text(format_bytes(shard.bytes_available), style="green" if shard.fits else "red"),
        )
    return table


class LaunchPanel(Vertical):
    """Shows what would load where before anything loads; posts the strategy the user picks."""

    class StrategyChosen(Message):
        def __init__(self, strategy: Strategy) -> None:
            super().__init__()
            self.strategy = strategy

    def compose(self) -> ComposeResult:
        yield Static("No model chosen — Ctrl+O picks one", id="launch-model")
        with RadioSet(id="strategy"):
            yield RadioButton(
                "pipeline: layer ranges by memory", value=True, id="strategy-pipeline"
            )
            yield RadioButton("tensor: every layer split", id="strategy-tensor")
        yield Static(id="strategy-note")
        yield Static(id="placement")
        yield Static(id="launch-status")

    def on_mount(self) -> None:
        self.border_title = "Model & placement"

    def show(
        self,
        card: ModelCard | None,
        strategy: Strategy,
        placement: Placement | PlacementError | None,
        names: Mapping[str, str],
    ) -> None:
        model = self.query_one("#launch-model", Static)
        if card is None:
            model.update("No model chosen — Ctrl+O picks one")
        else:
            model.update(Text.assemble((card.name, "bold"), "\n", describe(card)))
        tensor = self.query_one("#strategy-tensor", RadioButton)
        note = self.query_one("#strategy-note", Static)
        tensor_ok = card is None or card.supports_tensor
        tensor.disabled = not tensor_ok
        note.update(
            ""
            if tensor_ok or card is None
            else Text(f"tensor unavailable: {card.tensor_unsupported_reason}", style="dim")
        )
        button = "#strategy-tensor" if strategy == "tensor" else "#strategy-pipeline"
        with self.prevent(RadioSet.Changed):
            self.query_one(button, RadioButton).value = True
        self.query_one("#placement", Static).update(self._preview(placement, names))

    @staticmethod
    def _preview(placement: Placement | PlacementError | None, names: Mapping[str, str]) -> object:
        if placement is None:
            return ""
        if isinstance(placement, Placement):
            headline = Text(
                f"fits: {placement.strategy} over {placement.world_size} node(s), "
                f"context {placement.context_length:,}",
                style="green",
            )
            return Group(headline, shard_table(placement.shards, names))
        headline = Text(placement.message, style="bold red")
        for shortfall in placement.shortfalls:
            headline.append("\n• " + shortfall.describe(), style="red")
        if placement.shards:
            return Group(headline, shard_table(placement.shards, names))
        return headline

    def set_status(self, text: str | Text) -> None:
        self.query_one("#launch-status", Static).update(text)

    @on(RadioSet.Changed, "#strategy")
    def _strategy_changed(self, event: RadioSet.Changed) -> None:
        chosen: Strategy = "tensor" if event.pressed.id == "strategy-tensor" else "pipeline"
        self.post_message(self.StrategyChosen(chosen))
