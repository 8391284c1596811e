"""What the app remembers between runs that is not a chat: the theme, in `settings.json`.

A settings file that cannot be read or written costs the user the remembered choice, never the
app: reading it gives the defaults, and a failed write is reported to the caller.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from exo_tui.store.paths import config_dir


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    theme: str | None = None


def settings_path() -> Path:
    return config_dir() / "settings.json"


def load_settings(path: Path | None = None) -> Settings:
    """The saved settings; the defaults when there are none or the file is unreadable."""
    path = path or settings_path()
    try:
        return Settings.model_validate_json(path.read_bytes())
    except (OSError, ValidationError):
        return Settings()


def save_settings(settings: Settings, path: Path | None = None) -> None:
    """Write the settings whole (a new file moved over the old one); raises OSError."""
    path = path or settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(settings.model_dump_json(indent=2) + "\n", encoding="utf-8")
    os.replace(partial, path)
