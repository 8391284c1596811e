"""Pick an earlier message of the open chat to edit and fork a new chat (a branch) from."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from engine.types import Message
from exo_tui.app.keys import shown

PREVIEW_CHARS = 70  # of each message, on one line: enough to tell them apart


def user_messages(messages: Sequence[Message]) -> list[tuple[int, str]]:
    """Each user message's position in the chat and its text, the newest first."""
    found = [(i, m.content) for i, m in enumerate(messages) if m.role == "user"]
    return found[::-1]


def preview(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= PREVIEW_CHARS else flat[: PREVIEW_CHARS - 1] + "…"


class ForkFromScreen(ModalScreen[int | None]):
    """Dismisses with the position of the user message picked, or None."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="fork.cancel"),
    ]

    def __init__(self, messages: Sequence[Message]) -> None:
        super().__init__()
        self._choices = user_messages(messages)

    def compose(self) -> ComposeResult:
        with Vertical(id="fork-from"):
            cancel = shown("fork.cancel", self.BINDINGS)
            yield Label(f"Fork from a message  [dim](Enter edits it, {cancel} cancels)[/]")
            yield Label("[dim]Sending the edit starts a new chat from there; this one is kept.[/]")
            options = [
                Option(Text.assemble((f"{n:>2}. ", "dim"), preview(text)), id=str(position))
                for n, (position, text) in zip(
                    range(len(self._choices), 0, -1), self._choices, strict=True
                )
            ]
            yield OptionList(*options, id="fork-list")

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        if options.option_count:
            options.highlighted = 0
        options.focus()

    @on(OptionList.OptionSelected, "#fork-list")
    def _chosen(self, event: OptionList.OptionSelected) -> None:
        assert event.option.id is not None
        self.dismiss(int(event.option.id))

    def action_cancel(self) -> None:
        self.dismiss(None)
