"""Every app-level key binding in one list: footer, command palette, help and keymap read it."""

from __future__ import annotations

from textual.binding import Binding

APP_BINDINGS: list[Binding] = [
    Binding("ctrl+o", "pick_model", "Model", id="app.pick_model"),
    Binding("ctrl+t", "toggle_strategy", "Strategy", id="app.toggle_strategy"),
    Binding("ctrl+l", "launch", "Launch", id="app.launch"),
    Binding("f2", "choose_nodes", "Nodes", id="app.choose_nodes"),
    # Priority: the prompt (a TextArea) would take Ctrl+U as "delete to line start".
    Binding("ctrl+u", "unload", "Unload", id="app.unload", priority=True),
    Binding("escape", "stop", "Stop", id="app.stop"),
    Binding("ctrl+n", "new_chat", "New chat", id="app.new_chat"),
    Binding("ctrl+r", "chats", "Chats", id="app.chats"),
    Binding("ctrl+s", "export_chat", "Export chat", id="app.export_chat", show=False),
    Binding("f3", "copy_answer", "Copy answer", id="app.copy_answer", show=False),
    Binding("f1", "help", "Help", id="app.help"),
    Binding("question_mark", "help", "Help", id="app.help_key", show=False),
    Binding("ctrl+q", "quit", "Quit", id="app.quit"),
]
