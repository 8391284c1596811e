"""The chat's settings: its system prompt, temperature and answer length, with presets."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Label, RadioButton, RadioSet

from exo_tui.app.keys import shown
from exo_tui.store.records import MAX_ANSWER_TOKENS, MAX_TEMPERATURE, ChatSettings

# Temperatures by name: "exact" answers the same each time (and is the default).
PRESETS = {"exact": 0.0, "precise": 0.2, "balanced": 0.7, "creative": 1.0}


def parse_settings(
    system_prompt: str, temperature: str, max_tokens: str, default_prompt: str
) -> ChatSettings | str:
    """The settings typed, or what is wrong with them and how to put it right."""
    try:
        heat = float(temperature.strip())
    except ValueError:
        heat = -1.0
    if not 0.0 <= heat <= MAX_TEMPERATURE:
        return (
            f"Temperature must be a number from 0 to {MAX_TEMPERATURE:g}, not {temperature!r} "
            "(0 answers the same each time; higher varies more)."
        )
    try:
        tokens = int(max_tokens.strip().replace(",", "").replace("_", ""))
    except ValueError:
        tokens = 0
    if not 1 <= tokens <= MAX_ANSWER_TOKENS:
        return (
            f"Max tokens must be a whole number from 1 to {MAX_ANSWER_TOKENS:,}, "
            f"not {max_tokens!r} (an answer stops there)."
        )
    prompt = system_prompt.strip()
    return ChatSettings(
        system_prompt=None if prompt in ("", default_prompt) else prompt,
        temperature=heat,
        max_tokens=tokens,
    )


class ChatSettingsScreen(ModalScreen[ChatSettings | None]):
    """Dismisses with the new settings, or None when cancelled."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="chat_settings.cancel"),
        Binding("ctrl+s", "save", "Save", id="chat_settings.save"),
    ]

    def __init__(self, settings: ChatSettings, default_prompt: str) -> None:
        super().__init__()
        self._settings = settings
        self._default_prompt = default_prompt

    def compose(self) -> ComposeResult:
        settings = self._settings
        save, cancel = (shown(f"chat_settings.{n}", self.BINDINGS) for n in ("save", "cancel"))
        # Scrolls on a small terminal; Tab brings each field into view.
        with VerticalScroll(id="chat-settings"):
            yield Label(
                f"This chat's settings  [dim]Enter or {save} saves · {cancel} cancels · "
                "Tab moves[/]"
            )
            yield Label("Preset", classes="settings-label")
            with RadioSet(id="settings-preset"):
                for name, heat in PRESETS.items():
                    yield RadioButton(
                        f"{name} {heat:g}", value=heat == settings.temperature, name=name
                    )
            yield Label("System prompt", classes="settings-label")
            prompt = settings.system_prompt or self._default_prompt
            yield Input(prompt, id="settings-system")
            yield Label(f"Temperature (0 to {MAX_TEMPERATURE:g})", classes="settings-label")
            yield Input(f"{settings.temperature:g}", id="settings-temperature")
            yield Label(
                f"Max tokens: where an answer stops (1 to {MAX_ANSWER_TOKENS:,})",
                classes="settings-label",
            )
            yield Input(str(settings.max_tokens), id="settings-max-tokens")
            yield Label("", id="settings-error")

    def on_mount(self) -> None:
        self.query_one("#settings-error", Label).display = False
        self.query_one("#settings-system", Input).focus()

    @on(RadioSet.Changed, "#settings-preset")
    def _preset(self, event: RadioSet.Changed) -> None:
        name = event.pressed.name or ""
        if name in PRESETS:
            self.query_one("#settings-temperature", Input).value = f"{PRESETS[name]:g}"

    @on(Input.Submitted)
    def _submitted(self) -> None:
        self.action_save()

    def action_save(self) -> None:
        parsed = parse_settings(
            self.query_one("#settings-system", Input).value,
            self.query_one("#settings-temperature", Input).value,
            self.query_one("#settings-max-tokens", Input).value,
            self._default_prompt,
        )
        if isinstance(parsed, str):
            error = self.query_one("#settings-error", Label)
            error.update(parsed)
            error.display = True
            return
        self.dismiss(parsed)

    def action_cancel(self) -> None:
        self.dismiss(None)
