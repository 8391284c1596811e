"""Where exo-tui keeps its files: platformdirs locations, or one folder named by EXO_TUI_HOME.

With ``EXO_TUI_HOME=/some/folder`` everything lives under it (``data/`` and ``config/``), so
tests, scripts and users who want a portable setup can relocate it all with one variable.
The functions only compute paths; whoever writes a file creates its folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "exo-tui"
HOME_ENV = "EXO_TUI_HOME"


def home_override() -> Path | None:
    """The folder named by EXO_TUI_HOME (absolute, ``~`` expanded), or None when unset or empty."""
    value = os.environ.get(HOME_ENV, "").strip()
    if not value:
        return None
    return Path(value).expanduser().absolute()


def data_dir() -> Path:
    """Chats and other state that is not configuration."""
    home = home_override()
    if home is not None:
        return home / "data"
    return platformdirs.user_data_path(APP_NAME)


def config_dir() -> Path:
    """Settings, key bindings and the cluster key."""
    home = home_override()
    if home is not None:
        return home / "config"
    return platformdirs.user_config_path(APP_NAME)


def chats_db_path() -> Path:
    """The SQLite file that holds the chat history."""
    return data_dir() / "chats.db"
