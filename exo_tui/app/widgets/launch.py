"""The launch panel: the chosen model, the sharding strategy, and the placement preview."""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import RadioButton, RadioSet, Static

from engine.kv_memory import format_bytes
from engine.types import ModelCard, Strategy
from exo_tui.app.keys import shown
from exo_tui.app.screens.model_picker import describe
from exo_tui.app.widgets import quiet
from exo_tui.cluster.control.placement import PlacedShard, Placement, PlacementError


def shard_table(shards: tuple[PlacedShard, ...], names: Mapping[str, str]) -> Table:
    table = Table(box=None, pad_edge=False, expand=True, show_edge=False)
    table.add_column("node")
    table.add_column("layers")
    table.add_column("needs", justify="right")
    table.add_column("free", justify="right")
    for shard in shards:
        spec = shard.spec
        layers = f"{spec.start_layer}–{spec.end_layer - 1}" if spec.num_layers else "-"
        table.add_row(
            names.get(shard.node_id, shard.node_id),
            layers,
            format_bytes(shard.bytes_needed),
            Text(format_bytes(shard.bytes_available), style="green" if shard.fits else "red"),
        )
    return table


def preview_key(placement: Placement | PlacementError | None, names: Mapping[str, str]) -> object:
    """Everything the preview shows, at the precision it shows it (memory moves every second,
    its rounded figure rarely does)."""
    if placement is None:
        return None
    shards = tuple(
        (names.get(s.node_id, s.node_id), s.spec.start_layer, s.spec.end_layer, s.fits,
         format_bytes(s.bytes_needed), format_bytes(s.bytes_available))
        for s in placement.shards
    )  # fmt: skip
    if isinstance(placement, Placement):
        return ("fits", placement.strategy, placement.context_length, shards)
    return ("error", placement.message, tuple(f.describe() for f in placement.shortfalls), shards)


def no_model() -> str:
    return f"No model chosen — {shown('app.pick_model')} picks one"


class LaunchPanel(Vertical):
    """Shows what would load where before anything loads; posts the strategy the user picks."""

    class StrategyChosen(Message):
        def __init__(self, strategy: Strategy) -> None:
            super().__init__()
            self.strategy: Strategy = strategy

    def compose(self) -> ComposeResult:
        yield Static(no_model(), id="launch-model")
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
            quiet.show(model, no_model())
        else:
            quiet.show(model, Text.assemble((card.name, "bold"), "\n", describe(card)))
        tensor = self.query_one("#strategy-tensor", RadioButton)
        note = self.query_one("#strategy-note", Static)
        tensor_ok = card is None or card.supports_tensor
        tensor.disabled = not tensor_ok
        quiet.show(
            note,
            ""
            if tensor_ok or card is None
            else Text(f"tensor unavailable: {card.tensor_unsupported_reason}", style="dim"),
        )
        button = "#strategy-tensor" if strategy == "tensor" else "#strategy-pipeline"
        if not self.query_one(button, RadioButton).value:
            with self.prevent(RadioSet.Changed):
                self.query_one(button, RadioButton).value = True
        preview = self.query_one("#placement", Static)
        quiet.show(preview, self._preview(placement, names), preview_key(placement, names))

    @staticmethod
    def _preview(
        placement: Placement | PlacementError | None, names: Mapping[str, str]
    ) -> RenderableType:
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
        quiet.show(self.query_one("#launch-status", Static), text)

    @on(RadioSet.Changed, "#strategy")
    def _strategy_changed(self, event: RadioSet.Changed) -> None:
        chosen: Strategy = "tensor" if event.pressed.id == "strategy-tensor" else "pipeline"
        self.post_message(self.StrategyChosen(chosen))
