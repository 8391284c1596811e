"""The prompt: several lines, Enter sends, Up and Down at the edges walk the history."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from textual import events, on
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import TextArea

from exo_tui.app.keys import shown


class PromptInput(TextArea):
    """The prompt: several lines, Enter sends, Up and Down at the edges walk the history."""

    DEFAULT_CSS = """
    PromptInput {
        height: auto;
        min-height: 3;
        max-height: 10;
        border: tall $primary 50%;
        &:focus { border: tall $primary; }
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        # Priority, or TextArea would take Enter as a newline before any binding sees it. A
        # priority binding runs ahead of the keys still queued for the prompt, so the send itself
        # waits in the prompt's queue behind them (`_SendNow`).
        # Out of the footer: the prompt's placeholder says them, the footer keeps its room.
        Binding("enter", "send", "Send", id="prompt.send", priority=True, show=False),
        Binding("ctrl+j,shift+enter", "newline", "Newline", id="prompt.newline", show=False),
        Binding(
            "up",
            "history_previous",
            "Previous prompt",
            id="prompt.history_previous",
            show=False,
        ),
        Binding("down", "history_next", "Next prompt", id="prompt.history_next", show=False),
    ]

    class Submitted(Message):
        """The user sent a prompt."""

        def __init__(self, prompt_input: PromptInput, text: str) -> None:
            super().__init__()
            self.prompt_input = prompt_input
            self.text = text

        @property
        def control(self) -> PromptInput:
            return self.prompt_input

    def __init__(
        self,
        text: str = "",
        *,
        history: Sequence[str] = (),
        placeholder: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(
            text,
            soft_wrap=True,
            tab_behavior="focus",
            highlight_cursor_line=False,
            placeholder=placeholder if placeholder is not None else self._placeholder(),
            id=id,
            classes=classes,
        )
        self._history = list(history)
        self._history_index = len(self._history)
        self._draft = ""

    @classmethod
    def _placeholder(cls) -> str:
        send, newline = (shown(f"prompt.{name}", cls.BINDINGS) for name in ("send", "newline"))
        return f"Ask anything ({send} sends, {newline} new line)"

    @property
    def prompt_history(self) -> list[str]:
        """The prompts sent so far, oldest first, after the `history` passed in.

        (`TextArea.history` is the undo history.)
        """
        return list(self._history)

    @property
    def message(self) -> str:
        """What sending now would send (blank lines around it dropped)."""
        return self.text.rstrip().lstrip("\n")

    async def _on_key(self, event: events.Key) -> None:
        # The prompt's own editing keys (Backspace, the arrows, Home, Up for the history) are
        # bindings, which run once the key has bubbled up to the app: in a burst, after the
        # characters queued behind them have landed. Run them here, in the order they came.
        if not event.is_printable:
            active = self.screen.active_bindings.get(event.key)
            if active is not None and active.node is self and not active.binding.priority:
                event.stop()
                event.prevent_default()
                if active.enabled:
                    await self.run_action(active.binding.action)
                return
        await super()._on_key(event)

    class _SendNow(Message):
        """Send what the prompt holds once the keys typed before Enter have landed."""

    def action_send(self) -> None:
        self.post_message(self._SendNow())

    @on(_SendNow)
    def _send_now(self, event: _SendNow) -> None:
        event.stop()
        text = self.message
        if not text.strip():
            return
        if not self._history or self._history[-1] != text:
            self._history.append(text)
        self._history_index = len(self._history)
        self._draft = ""
        self.clear()
        self.post_message(self.Submitted(self, text))

    def give_back(self, text: str) -> None:
        """A send was refused: put its text back, before anything typed since."""
        typed = self.text
        self._load(f"{text}\n{typed}" if typed.strip() else text)

    def hold_for_edit(self, text: str, note: str | None) -> None:
        """Hold `text` to edit, with `note` in the border saying what sending does (None: a
        plain prompt again). What was typed before stays a step back in the undo history."""
        if note is None:
            self.border_title = None
            return
        self._load(text)
        self.border_title = note

    def action_newline(self) -> None:
        if not self.read_only:
            start, end = self.selection
            self.replace("\n", start, end, maintain_selection_offset=False)

    def action_history_previous(self) -> None:
        if self._history_index == 0 or not self.navigator.is_first_wrapped_line(
            self.cursor_location
        ):
            self.action_cursor_up()
            return
        if self._history_index == len(self._history):
            self._draft = self.text
        self._history_index -= 1
        self._load(self._history[self._history_index])

    def action_history_next(self) -> None:
        if self._history_index >= len(self._history) or not self.navigator.is_last_wrapped_line(
            self.cursor_location
        ):
            self.action_cursor_down()
            return
        self._history_index += 1
        at_draft = self._history_index == len(self._history)
        self._load(self._draft if at_draft else self._history[self._history_index])

    def _load(self, text: str) -> None:
        # replace, not load_text: the walk stays undoable.
        self.replace(text, self.document.start, self.document.end, maintain_selection_offset=False)
        self.move_cursor(self.document.end)
