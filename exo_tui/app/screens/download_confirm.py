"""Ask before downloading a catalogue model: its size, where it goes and the room left there."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Literal

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from engine.kv_memory import format_bytes
from exo_tui.app.keys import shown
from exo_tui.hub.cache import repo_folder
from exo_tui.hub.catalogue import CatalogueEntry


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
    where = repo_folder(entry.repo)
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


Choice = Literal["here", "shares"] | None


class DownloadConfirm(ModalScreen[Choice]):
    """Dismisses with "here" to download the whole model on this machine, "shares" to choose it
    and have each node of the placement fetch only its share at launch (offered when the
    model is placed across nodes), None to leave it."""

    BINDINGS = [
        Binding("enter", "download", "Download here", id="download.confirm"),
        Binding("s", "shares", "Each node its share", id="download.shares"),
        Binding("escape", "cancel", "Cancel", id="download.cancel"),
    ]

    def __init__(self, entry: CatalogueEntry, fits: bool, fit_note: str, nodes: int = 1) -> None:
        super().__init__()
        self._entry = entry
        self._fits = fits
        self._fit_note = fit_note
        self._node_count = nodes

    def compose(self) -> ComposeResult:
        with Vertical(id="download-confirm"):
            yield Label(Text.assemble("Download ", (self._entry.repo, "bold"), "?"))
            yield Static(
                download_summary(self._entry, self._fits, self._fit_note), id="download-summary"
            )
            confirm, cancel, shares = (
                shown(f"download.{name}", self.BINDINGS) for name in ("confirm", "cancel", "shares")
            )
            keys = f"[b]{confirm}[/] downloads it all here · [b]{cancel}[/] cancels"
            if self._node_count > 1:
                keys += (
                    f"\n[b]{shares}[/] chooses it: at launch each of the {self._node_count} nodes\n"
                    "downloads only the files of its layers"
                )
            yield Label(keys, id="download-keys")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return action != "shares" or self._node_count > 1

    def action_download(self) -> None:
        self.dismiss("here")

    def action_shares(self) -> None:
        self.dismiss("shares")

    def action_cancel(self) -> None:
        self.dismiss(None)
