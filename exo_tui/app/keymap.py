"""A user's key remapping: `keys.toml` in the config folder maps binding ids to keys.

[keys]
"app.launch" = "f5"
"app.stop" = "ctrl+c,escape"
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from pathlib import Path

from textual.binding import Binding


class KeymapError(Exception):
    """The keymap file cannot be used; the message names the file and the problem."""


def load_keymap(path: Path, bindings: Iterable[Binding]) -> dict[str, str]:
    """Binding id -> keys from `path`; a missing file is an empty keymap."""
    if not path.exists():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise KeymapError(f"{path} could not be read: {error}. Fix or delete it.") from error
    keys = data.get("keys", {})
    if not isinstance(keys, dict):
        raise KeymapError(f'{path}: [keys] must be a table of binding id = "keys".')
    known = {binding.id for binding in bindings if binding.id}
    keymap: dict[str, str] = {}
    for binding_id, value in keys.items():
        if binding_id not in known:
            raise KeymapError(
                f"{path}: unknown binding id {binding_id!r}; known ids: {', '.join(sorted(known))}"
            )
        if not isinstance(value, str) or not value.strip():
            raise KeymapError(f"{path}: the keys for {binding_id!r} must be a non-empty string")
        keymap[binding_id] = value
    return keymap
