"""How a binding's key is shown in hints and dialogs, following the user's keymap (keys.toml)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from textual.binding import Binding, BindingType

from exo_tui.app.bindings import APP_BINDINGS, CHAT_BINDINGS

_remapped: dict[str, str] = {}  # binding id -> keys, as the app applied them
NAMES = {
    "escape": "Esc",
    "enter": "Enter",
    "delete": "Del",
    "backspace": "Backspace",
    "question_mark": "?",
    "space": "Space",
    "tab": "Tab",
    "pageup": "PgUp",
    "pagedown": "PgDn",
}


def use_keymap(keymap: Mapping[str, str]) -> None:
    """The keymap the app applied: hints show its keys from now on."""
    _remapped.clear()
    _remapped.update(keymap)


def pretty(key: str) -> str:
    """ "ctrl+l" -> "Ctrl+L", "f5" -> "F5", "escape" -> "Esc"."""
    *modifiers, name = key.strip().split("+")
    shown = NAMES.get(name) or (name.upper() if len(name) == 1 or name[0] == "f" else name.title())
    return "+".join([*(m.title() for m in modifiers), shown])


def keys_of(binding: Binding, keymap: Mapping[str, str] | None = None) -> str:
    """Every key of `binding` as the user has them ("ctrl+c,escape"): in `keymap`, or by
    default in the keymap the app applied."""
    return (_remapped if keymap is None else keymap).get(binding.id or "", binding.key)


def shown(
    binding_id: str, bindings: Iterable[BindingType] = (*APP_BINDINGS, *CHAT_BINDINGS)
) -> str:
    """The first key of the binding `binding_id` among `bindings`, as the user has it now."""
    binding = next((b for b in bindings if isinstance(b, Binding) and b.id == binding_id), None)
    if binding is None:
        raise KeyError(f"no binding {binding_id!r}")
    return pretty(keys_of(binding).split(",")[0])
