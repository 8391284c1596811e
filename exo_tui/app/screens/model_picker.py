"""The model picker: models on disk, then catalogue models to download, with size and fit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option

from engine.kv_memory import format_bytes
from engine.types import ModelCard
from exo_tui.app.keys import shown
from exo_tui.hub.catalogue import CatalogueEntry


@dataclass(frozen=True)
class PickerEntry:
    card: ModelCard
    fits: bool
    fit_note: str  # e.g. "fits (pipeline)" or "needs 3.1 GB more"
    catalogue: CatalogueEntry | None = None  # set for a catalogue model that is not on disk


def describe(card: ModelCard) -> str:
    weights = f"{card.quantization.bits}-bit" if card.quantization else (card.dtype or "?")
    size = f"{card.bytes_on_disk / 1e6:,.1f} MB"
    partial = f" ({card.partial_note})" if card.partial_note else ""
    return f"{card.model_type}, {card.num_layers} layers, {size}, {weights}{partial}"


def describe_entry(entry: CatalogueEntry) -> str:
    return (
        f"{entry.model_type}, {entry.parameters / 1e9:.1f}B params, {entry.layers} layers, "
        f"{format_bytes(entry.bytes)}, {entry.bits}-bit"
    )


def entry_label(entry: PickerEntry) -> Text:
    card = entry.card
    if entry.catalogue is not None:
        where, details = ("  catalogue · not downloaded", "yellow"), describe_entry(entry.catalogue)
    else:
        where = ("  demo" if card.source == "bundled" else f"  {card.source}", "dim")
        details = describe(card)
    return Text.assemble(
        (card.name, "bold"),
        where,
        "\n  ",
        details,
        "  ",
        (entry.fit_note, "green" if entry.fits else "red"),
    )


def haystack(entry: PickerEntry) -> str:
    """What the filter matches: name, type, where it is (and "catalogue download")."""
    where = "catalogue download" if entry.catalogue is not None else entry.card.source
    return f"{entry.card.name} {entry.card.model_type} {where}".lower()


def match_rank(entry: PickerEntry, query: str) -> int:
    """How well a filter matches a model's name: the name itself, then its start, then within it,
    then elsewhere (its type or where it is). Ties keep the list's order."""
    name, wanted = entry.card.name.lower(), query.strip().lower()
    if name == wanted:
        return 0
    if name.startswith(wanted):
        return 1
    return 2 if wanted in name else 3


class ModelPicker(ModalScreen[PickerEntry | None]):
    """Pick a model; dismisses with its entry, or None when cancelled."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="picker.cancel"),
        Binding("down", "cursor_down", "Next", show=False, id="picker.down"),
        Binding("up", "cursor_up", "Previous", show=False, id="picker.up"),
    ]

    def __init__(self, entries: Sequence[PickerEntry], selected: str | None = None) -> None:
        super().__init__()
        self._entries = list(entries)
        self._selected = selected

    def compose(self) -> ComposeResult:
        with Vertical(id="picker"):
            cancel = shown("picker.cancel", self.BINDINGS)
            yield Label(
                f"Pick a model  [dim](type to filter, Enter to choose, {cancel} to cancel)[/]"
            )
            yield Input(placeholder="filter", id="picker-filter")
            yield OptionList(id="picker-list")
            if not self._entries:
                yield Label(
                    "No models found. Put an mlx-lm model folder in the models folder, pass "
                    "--models-dir DIR, or download one from Hugging Face (mlx-community).",
                    id="picker-empty",
                )

    def on_mount(self) -> None:
        self._fill("")

    def _fill(self, query: str) -> None:
        options = self.query_one("#picker-list", OptionList)
        options.clear_options()
        words = query.lower().split()
        matches = [e for e in self._entries if all(word in haystack(e) for word in words)]
        if words:  # the best match first, and Enter takes it
            matches.sort(key=lambda entry: match_rank(entry, query))
        highlighted = 0
        for entry in matches:
            options.add_option(Option(entry_label(entry), id=entry.card.path))
            if not words and entry.card.name == self._selected:
                highlighted = options.option_count - 1
        if options.option_count:
            options.highlighted = highlighted

    @on(Input.Changed, "#picker-filter")
    def _filter(self, event: Input.Changed) -> None:
        self._fill(event.value)

    @on(Input.Submitted, "#picker-filter")
    def _choose_highlighted(self) -> None:
        options = self.query_one("#picker-list", OptionList)
        if options.highlighted is not None:
            self._choose(options.get_option_at_index(options.highlighted).id)

    @on(OptionList.OptionSelected, "#picker-list")
    def _chosen(self, event: OptionList.OptionSelected) -> None:
        self._choose(event.option.id)

    def _choose(self, path: str | None) -> None:
        for entry in self._entries:
            if entry.card.path == path:
                self.dismiss(entry)
                return

    def action_cursor_down(self) -> None:
        self.query_one("#picker-list", OptionList).action_cursor_down()

    def action_cursor_up(self) -> None:
        self.query_one("#picker-list", OptionList).action_cursor_up()

    def action_cancel(self) -> None:
        self.dismiss(None)
