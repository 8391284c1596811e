"""Every app-level key binding in one list: footer, command palette, help and keymap read it."""

from __future__ import annotations

from textual.binding import Binding

# The tooltip says what the action does: the command palette shows it under the name.
# The footer shows them in this order, the keys a newcomer needs first.
APP_BINDINGS: list[Binding] = [
    Binding("f1", "help", "Help", id="app.help", tooltip="What exo-tui is, and every key"),
    Binding("ctrl+o", "pick_model", "Model", id="app.pick_model", tooltip="Pick a model to run"),
    Binding("ctrl+l", "launch", "Launch", id="app.launch", tooltip="Load the placement shown"),
    Binding(
        "escape", "stop", "Stop", id="app.stop", tooltip="Stop the answer, the load or the download"
    ),
    Binding("ctrl+n", "new_chat", "New chat", id="app.new_chat", tooltip="Start a new chat"),
    Binding(
        "ctrl+r", "chats", "Chats", id="app.chats", tooltip="Reopen, rename, delete or export chats"
    ),
    Binding(
        "ctrl+t",
        "toggle_strategy",
        "Strategy",
        id="app.toggle_strategy",
        tooltip="Switch between pipeline and tensor sharding",
    ),
    Binding(
        "f2", "choose_nodes", "Nodes", id="app.choose_nodes", tooltip="Choose the nodes to place on"
    ),
    Binding(
        "ctrl+u",
        "unload",
        "Unload",
        id="app.unload",
        # Priority: the prompt (a TextArea) would take Ctrl+U as "delete to line start". Out of
        # the footer (priority keys go first there); the launch panel says it when it applies.
        priority=True,
        show=False,
        tooltip="Unload the model",
    ),
    Binding("ctrl+q", "quit", "Quit", id="app.quit", tooltip="Quit exo-tui"),
    Binding(
        "ctrl+s",
        "export_chat",
        "Export chat",
        id="app.export_chat",
        show=False,
        tooltip="Export this chat to Markdown",
    ),
    Binding(
        "f3",
        "copy_answer",
        "Copy answer",
        id="app.copy_answer",
        show=False,
        tooltip="Copy the last answer to the clipboard",
    ),
    Binding(
        "f4",
        "copy_code",
        "Copy code",
        id="app.copy_code",
        show=False,
        tooltip="Copy a code block of the last answer: the last, then each one before it",
    ),
    Binding("question_mark", "help", "Help", id="app.help_key", show=False),
]
# The chat's own keys: the main screen's, so no dialog on top of it takes them. Out of the
# footer (the newcomer's keys keep its room); the palette and Help list them.
CHAT_BINDINGS: list[Binding] = [
    Binding(
        "ctrl+g",
        "regenerate",
        "Regenerate",
        id="chat.regenerate",
        show=False,
        tooltip="Answer the last message again, in place of its answer",
    ),
    Binding(
        "f8",  # the prompt (a TextArea) holds F6 and F7
        "edit_last",
        "Edit last message",
        id="chat.edit_last",
        show=False,
        tooltip="Put your last message back in the prompt: sending replaces it and its answer",
    ),
    Binding(
        "f9",
        "fork",
        "Fork from a message",
        id="chat.fork",
        show=False,
        tooltip="Edit an earlier message: sending starts a new chat from there, this one is kept",
    ),
    Binding(
        "ctrl+f",
        "chat_settings",
        "Chat settings",
        id="chat.settings",
        show=False,
        tooltip="This chat's system prompt, temperature (with presets) and max tokens",
    ),
]
# Not in the palette: the same action as another binding, or one Textual's palette lists.
PALETTE_SKIPS = frozenset({"app.help_key", "app.quit"})
