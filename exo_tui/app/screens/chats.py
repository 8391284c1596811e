"""The chats list: find, reopen, rename, delete and export the stored chats.

Typing filters the list (titles, then what the messages say, each chat with the words around
its first match: a search across chats). The table keeps the focus, so the list's own keys
(Del, F2, Enter) stay what they are while a filter is typed. A branch (a chat forked from an
earlier message of another) sits under the chat it forks from; filtered, it names it.
"""

from __future__ import annotations

import re
from pathlib import Path

from rich.markup import escape
from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import DataTable, Input, Label

from exo_tui.app.keys import shown
from exo_tui.store.chat_errors import ChatStoreError
from exo_tui.store.chats import ChatStore
from exo_tui.store.records import ChatMatch, ChatSummary


def export_chat(store: ChatStore, chat: ChatSummary, folder: Path) -> Path:
    """Write the chat as Markdown into `folder`; returns the file's path."""
    return write_export(folder, chat, store.export_markdown(chat.id))


def write_export(folder: Path, chat: ChatSummary, markdown: str) -> Path:
    """Write a chat's Markdown into `folder`, named by its start and title; the file's path."""
    folder.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-zA-Z0-9]+", "-", chat.title).strip("-").lower()[:40] or "chat"
    path = folder / f"{chat.created_at:%Y%m%d-%H%M%S}-{slug}.md"
    path.write_text(markdown, encoding="utf-8")
    return path


BRANCH = "⑂ "


def as_tree(chats: list[ChatSummary]) -> list[tuple[ChatSummary, int]]:
    """Each chat with its depth: every branch right under the chat it forks from, in the
    list's order; a chat that forks from none (or from one no longer listed) at depth 0."""
    listed = {chat.id for chat in chats}
    branches: dict[str, list[ChatSummary]] = {}
    roots: list[ChatSummary] = []
    for chat in chats:
        if chat.parent_id is not None and chat.parent_id in listed:
            branches.setdefault(chat.parent_id, []).append(chat)
        else:
            roots.append(chat)
    rows: list[tuple[ChatSummary, int]] = []

    def add(chat: ChatSummary, depth: int) -> None:
        rows.append((chat, depth))
        for branch in branches.get(chat.id, []):
            add(branch, depth + 1)

    for root in roots:
        add(root, 0)
    return rows


class ChatsScreen(ModalScreen[ChatSummary | None]):
    """Dismisses with the chat to reopen, or None. Del asks first, then deletes on a second Del."""

    class Deleted(Message):
        """A chat was deleted from the store (the app starts a new chat if it was the open one)."""

        def __init__(self, chat_id: str) -> None:
            super().__init__()
            self.chat_id = chat_id

    BINDINGS = [
        Binding("escape", "close", "Close", id="chats.close"),
        Binding("enter", "open", "Open", id="chats.open", priority=True),
        Binding("f2", "rename", "Rename", id="chats.rename"),
        Binding("delete", "delete", "Delete", id="chats.delete"),
        Binding("ctrl+s", "export", "Export", id="chats.export"),
    ]

    def __init__(self, store: ChatStore, export_dir: Path, open_chat: str | None = None) -> None:
        """`open_chat`: the id of the chat on screen, marked in the list."""
        super().__init__()
        self._store = store
        self._export_dir = export_dir
        self._open_chat = open_chat
        self._chats: list[ChatSummary] = []
        self._found: dict[str, ChatMatch] = {}  # chat id -> where its messages say the filter
        self._armed: str | None = None  # the chat a second Del deletes
        self.filter = ""

    def compose(self) -> ComposeResult:
        with Vertical(id="chats"):
            keys = [shown(f"chats.{name}", self.BINDINGS) for name in ("open", "rename", "delete")]
            export = shown("chats.export", self.BINDINGS)
            yield Label(
                f"Chats  [dim]{keys[0]} opens · {keys[1]} renames · {keys[2]} deletes · "
                f"{export} exports[/]"
            )
            yield Label("", id="chats-filter")
            yield DataTable(id="chats-table", cursor_type="row")
            yield Label("", id="chats-confirm")
            yield Input(placeholder="new title, Enter to save", id="chats-rename")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        # What the filter found comes next to the title: a narrow terminal clips the right.
        table.add_columns("title", "found", "model", "messages", "updated")
        self.query_one("#chats-rename", Input).display = False
        self.query_one("#chats-confirm", Label).display = False
        self._fill()
        table.focus()

    def _fill(self) -> None:
        table = self.query_one(DataTable)
        table.clear()
        every = self._store.list_chats()
        matching = self._matching(every)
        # Filtered, the list is what matched, best first: a branch names its parent instead.
        rows = as_tree(matching) if not self.filter else [(chat, 0) for chat in matching]
        self._chats = [chat for chat, _ in rows]
        titles = {chat.id: chat.title for chat in every}
        self._show_filter()
        for chat, depth in rows:
            title = chat.title
            if chat.parent_id is not None:
                title = "  " * (depth - 1) + BRANCH + title
                if depth == 0 and chat.parent_id in titles:
                    title += f" · from {titles[chat.parent_id]}"
            table.add_row(
                f"● {title}" if chat.id == self._open_chat else title,
                self._snippet(chat),
                chat.model,
                str(chat.message_count),
                f"{chat.updated_at.astimezone():%Y-%m-%d %H:%M}",
                key=chat.id,
            )

    def _snippet(self, chat: ChatSummary) -> Text:
        """Where the chat's messages say the filter, the words themselves marked."""
        match = self._found.get(chat.id)
        if match is None:
            return Text("")
        text = Text(match.snippet, style="dim")
        text.highlight_words([self.filter.strip()], "bold not dim", case_sensitive=False)
        return text

    def _matching(self, chats: list[ChatSummary]) -> list[ChatSummary]:
        """The chats the filter keeps: those it names in their titles first, then those whose
        messages say it (each group latest first)."""
        wanted = " ".join(self.filter.split()).casefold()
        self._found = {m.chat_id: m for m in self._store.search(self.filter)} if wanted else {}
        if not wanted:
            return chats
        by_title = [chat for chat in chats if wanted in chat.title.casefold()]
        titled = {chat.id for chat in by_title}
        said = [chat for chat in chats if chat.id in self._found and chat.id not in titled]
        return by_title + said

    def _show_filter(self) -> None:
        label = self.query_one("#chats-filter", Label)
        if not self.filter:
            label.update("[dim]Type to filter by title or by what the chats say[/]")
        elif self._chats:
            label.update(
                f"filter: [b]{escape(self.filter)}[/]▏ [dim]Backspace edits · Esc clears[/]"
            )
        else:
            label.update(
                f"filter: [b]{escape(self.filter)}[/]▏ [dim]no chat says it · Esc clears[/]"
            )

    def on_key(self, event: events.Key) -> None:
        """Typed text goes to the filter, unless it is a new title being typed."""
        if isinstance(self.focused, Input):
            return
        if event.key == "backspace" and self.filter:
            self.filter = self.filter[:-1]
        elif event.is_printable and event.character:
            self.filter += event.character
        else:
            return
        event.stop()
        event.prevent_default()
        self._disarm()
        self._fill()

    def _selected(self) -> ChatSummary | None:
        table = self.query_one(DataTable)
        if not self._chats or table.cursor_row >= len(self._chats):
            return None
        return self._chats[table.cursor_row]

    async def action_open(self) -> None:
        rename = self.query_one("#chats-rename", Input)
        if rename.display:
            await rename.action_submit()
            return
        self.dismiss(self._selected())

    def action_close(self) -> None:
        if self.filter:  # Esc takes the filter back first, then closes
            self.filter = ""
            self._fill()
            return
        self.dismiss(None)

    def action_rename(self) -> None:
        chat = self._selected()
        if chat is None:
            return
        rename = self.query_one("#chats-rename", Input)
        rename.value = chat.title
        rename.display = True
        rename.focus()

    @on(Input.Submitted, "#chats-rename")
    def _renamed(self, event: Input.Submitted) -> None:
        chat = self._selected()
        event.input.display = False
        if chat is not None and event.value.strip():
            try:
                self._store.rename(chat.id, event.value)
            except ChatStoreError as error:
                self.notify(f"Could not rename the chat: {error}", severity="error", timeout=10)
            self._fill()
        self.query_one(DataTable).focus()

    def action_delete(self) -> None:
        chat = self._selected()
        if chat is None:
            return
        if self._armed != chat.id:
            self._arm(chat)
            return
        self._disarm()
        try:
            self._store.delete(chat.id)
        except ChatStoreError as error:
            self.notify(f"Could not delete the chat: {error}", severity="error", timeout=10)
            return
        self._fill()
        self.post_message(self.Deleted(chat.id))
        self.notify(f"Deleted “{chat.title}”.")

    def _arm(self, chat: ChatSummary) -> None:
        self._armed = chat.id
        messages = "1 message" if chat.message_count == 1 else f"{chat.message_count} messages"
        confirm = self.query_one("#chats-confirm", Label)
        again = shown("chats.delete", self.BINDINGS)
        branches = sum(1 for other in self._store.list_chats() if other.parent_id == chat.id)
        kept = {0: "", 1: " Its branch stays."}.get(branches, f" Its {branches} branches stay.")
        confirm.update(f"Delete “{chat.title}” ({messages})? [b]{again}[/] again deletes it.{kept}")
        confirm.display = True

    def _disarm(self) -> None:
        self._armed = None
        self.query_one("#chats-confirm", Label).display = False

    @on(DataTable.RowHighlighted, "#chats-table")
    def _moved(self) -> None:
        chat = self._selected()
        if self._armed is not None and (chat is None or chat.id != self._armed):
            self._disarm()

    def action_export(self) -> None:
        chat = self._selected()
        if chat is not None:
            self.notify(f"Exported to {export_chat(self._store, chat, self._export_dir)}")
