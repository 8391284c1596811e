"""Ask before downloading a catalogue model: its size, where it goes and the room left there."""

from __future__ import annotations

import shutil
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from exo_tui.catalogue import CatalogueEntry, cache_folder
from exo_tui.cluster.placement import format_bytes


def free_bytes(folder: Path) -> int | None:
    """Free space on the disk that holds (or will hold) `folder`; None when unknown."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def short_path(path: Path) -> str:
    """`path` with the home folder written as ~."""
    try:
        return "~/" + str(path.relative_to(Path.home()))
    except ValueError:
        return str(path)


def download_summary(entry: CatalogueEntry, fits: bool, fit_note: str) -> Text:
    where = cache_folder(entry.repo)
    free = free_bytes(where)
    room = "" if free is None else f"; {format_bytes(free)} free there"
    return Text.assemble(
        f"{entry.parameters / 1e9:.1f}B parameters · {entry.layers} layers · {entry.bits}-bit · ",
        (format_bytes(entry.bytes), "bold"),
        "\n",
        (fit_note, "green" if fits else "red"),
        "\ninto ",
        short_path(where),
        (f"\n(the Hugging Face cache{room})", "dim"),
    )


class DownloadConfirm(ModalScreen[bool]):
    """Dismisses with True to download, False to leave it."""

    BINDINGS = [
        Binding("enter", "download", "Download", id="download.confirm"),
        Binding("escape", "cancel", "Cancel", id="download.cancel"),
    ]

    def __init__(self, entry: CatalogueEntry, fits: bool, fit_note: str) -> None:
        super().__init__()
        self._entry = entry
        self._fits = fits
        self._fit_note = fit_note

    def compose(self) -> ComposeResult:
        with Vertical(id="download-confirm"):
            yield Label(Text.assemble("Download ", (self._entry.repo, "bold"), "?"))
            yield Static(
                download_summary(self._entry, self._fits, self._fit_note), id="download-summary"
            )
            yield Label("[b]Enter[/] downloads · [b]Esc[/] cancels", id="download-keys")

    def action_download(self) -> None:
        self.dismiss(True)

    def action_cancel(self) -> None:
        self.dismiss(False)
