"""Help: what exo-tui is and every key, read from the same binding list as the footer."""

from __future__ import annotations

from collections.abc import Sequence

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import DataTable, Markdown

from exo_tui.app.keys import shown
from exo_tui.app.widgets.prompt import PromptInput

ABOUT = """\
# exo-tui

Run one model across the machines you own. Run `exo-tui node` on the other machines: nodes find
each other over mDNS, or name one with `--peer host:port`.

1. **Model** — pick one (the bundled demo works offline); a catalogue model is downloaded first.
2. **Strategy** — *pipeline* gives each node a contiguous range of layers, sized by memory;
   *tensor* splits every layer across the nodes.
3. **Launch** — each node loads its layers; the bars show them land.
4. **Chat** — {send} sends, {newline} adds a line, {stop} stops the answer. Tool calls run live;
   Enter or a click opens a tool card.
5. **Again** — {regenerate} answers the last message again, {edit} edits it and sends it again,
   {settings} sets this chat's system prompt, temperature and answer length. In {chats}, type to
   find a chat by its title or by anything it says.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape", "dismiss", "Close", id="help.close"),
        Binding("f1", "dismiss", "Close", show=False, id="help.close_f1"),
    ]

    def __init__(self, bindings: Sequence[tuple[str, str, str]]) -> None:
        """`bindings`: (key as displayed, description, binding id) rows."""
        super().__init__()
        self._rows = list(bindings)

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            keys = {
                "send": shown("prompt.send", PromptInput.BINDINGS),
                "newline": shown("prompt.newline", PromptInput.BINDINGS),
                "stop": shown("app.stop"),
                "regenerate": shown("chat.regenerate"),
                "edit": shown("chat.edit_last"),
                "settings": shown("chat.settings"),
                "chats": shown("app.chats"),
            }
            yield Markdown(ABOUT.format(**keys))
            yield DataTable(id="help-keys", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table = self.query_one("#help-keys", DataTable)
        table.add_columns("key", "action", "id (for keys.toml)")
        for row in self._rows:
            table.add_row(*row)
