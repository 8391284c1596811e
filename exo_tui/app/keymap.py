"""A user's key remapping: `keys.toml` in the config folder maps binding ids to keys.

[keys]
"app.launch" = "f5"
"app.stop" = "ctrl+c,escape"
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from textual.binding import Binding, BindingType
from textual.keys import Keys, _character_to_key  # pyright: ignore[reportPrivateUsage]

from exo_tui.app.keys import keys_of

MODIFIERS = frozenset({"ctrl", "shift", "alt", "meta", "super", "hyper"})
# The names Textual gives keys: its named keys, and each printable character's name.
KEY_NAMES = frozenset(
    {key.value.split("+")[-1] for key in Keys}
    | {_character_to_key(chr(code)) for code in range(33, 127)}
    | {"enter", "tab", "space", "backspace", "escape"}
    | {f"f{n}" for n in range(1, 25)}
)


class KeymapError(Exception):
    """The keymap file cannot be used; the message names the file, the line and the problem."""


def binding_scopes() -> dict[str, list[Binding]]:
    """The bindings that are active together, by where they live: the main screen (the app's
    keys and the prompt's), then each dialog."""
    from exo_tui.app.bindings import APP_BINDINGS, CHAT_BINDINGS
    from exo_tui.app.screens.chat_settings import ChatSettingsScreen
    from exo_tui.app.screens.chats import ChatsScreen
    from exo_tui.app.screens.download_confirm import DownloadConfirm
    from exo_tui.app.screens.fork_from import ForkFromScreen
    from exo_tui.app.screens.help import HelpScreen
    from exo_tui.app.screens.model_picker import ModelPicker
    from exo_tui.app.screens.nodes import NodesScreen
    from exo_tui.app.widgets.prompt import PromptInput
    from exo_tui.app.widgets.requests import RequestsTable

    def bindings(items: Iterable[BindingType]) -> list[Binding]:
        return [item for item in items if isinstance(item, Binding)]

    return {
        "main screen": [*APP_BINDINGS, *CHAT_BINDINGS, *bindings(PromptInput.BINDINGS)],
        "chats": bindings(ChatsScreen.BINDINGS),
        "chat settings": bindings(ChatSettingsScreen.BINDINGS),
        "download question": bindings(DownloadConfirm.BINDINGS),
        "fork from a message": bindings(ForkFromScreen.BINDINGS),
        "help": bindings(HelpScreen.BINDINGS),
        "model picker": bindings(ModelPicker.BINDINGS),
        "nodes": bindings(NodesScreen.BINDINGS),
        "API requests": bindings(RequestsTable.BINDINGS),
    }


def is_key(key: str) -> bool:
    """Whether Textual can ever report `key`: modifiers, then one key name or character."""
    *modifiers, name = key.split("+")
    if any(modifier not in MODIFIERS for modifier in modifiers):
        return False
    return name in KEY_NAMES or (len(name) == 1 and name.isprintable() and not name.isspace())


def _line_of(text: str, binding_id: str) -> int:
    pattern = re.compile(rf"""^\s*["']?{re.escape(binding_id)}["']?\s*=""")
    for number, line in enumerate(text.splitlines(), start=1):
        if pattern.match(line):
            return number
    return 1


def load_keymap(
    path: Path, scopes: Mapping[str, Sequence[Binding]] | None = None
) -> dict[str, str]:
    """Binding id -> keys from `path`; a missing file is an empty keymap. Every problem (an unknown
    id or key, a key that another action of the same screen holds) is reported at once, each with
    its line, and then none of the file applies."""
    if not path.exists():
        return {}
    try:
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise KeymapError(f"{path} could not be read: {error}. Fix or delete it.") from error
    keys = data.get("keys", {})
    if not isinstance(keys, dict):
        raise KeymapError(f'{path}: [keys] must be a table of binding id = "keys".')
    scopes = binding_scopes() if scopes is None else scopes
    known = {binding.id for group in scopes.values() for binding in group if binding.id}
    keymap: dict[str, str] = {}
    problems: list[str] = []
    for binding_id, value in keys.items():  # pyright: ignore[reportUnknownVariableType]
        where = f"{path}:{_line_of(text, str(binding_id))}"
        if binding_id not in known:
            problems.append(f"{where}: unknown binding id {binding_id!r} (see Help, F1, for ids)")
        elif not isinstance(value, str) or not value.strip():
            problems.append(f"{where}: the keys for {binding_id!r} must be a non-empty string")
        else:
            bad = [key for key in value.split(",") if not is_key(key.strip())]
            if bad:
                problems.append(
                    f"{where}: {', '.join(repr(k.strip()) for k in bad)} is not a key "
                    f'(write keys as Textual names them: "f5", "ctrl+l", "escape")'
                )
            else:
                keymap[str(binding_id)] = value
    for scope, group in scopes.items():
        holders: dict[str, Binding] = {}
        for binding in group:
            for key in filter(None, (k.strip() for k in keys_of(binding, keymap).split(","))):
                other = holders.setdefault(key, binding)
                if other.action != binding.action and (binding.id in keymap or other.id in keymap):
                    moved = binding if binding.id in keymap else other
                    held = other if moved is binding else binding
                    problems.append(
                        f"{path}:{_line_of(text, moved.id or '')}: {key!r} for {moved.id!r} is "
                        f"already {held.id!r} ({held.description}) on the {scope}; map "
                        f"{held.id!r} to another key too, or choose another key"
                    )
    if problems:
        raise KeymapError("; ".join(problems) + ". The default keys apply until it is fixed.")
    return keymap
