"""Where models live: the default models folder, the bundled demo, the Hugging Face cache, and
which hub repo a cache folder holds."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

DEMO_SPEC = "demo"


# The engine imports nothing of exo_tui, so it reads exo_tui's home variable the way
# exo_tui.store.paths does: everything under that one folder when it is set.
HOME_ENV = "EXO_TUI_HOME"


def default_models_dir() -> Path:
    """Where `exo-tui models` keeps downloaded models: `data/models` under EXO_TUI_HOME when it
    is set, else in the user's data folder."""
    home = os.environ.get(HOME_ENV, "").strip()
    if home:
        return Path(home).expanduser().absolute() / "data" / "models"
    return platformdirs.user_data_path("exo-tui") / "models"


def bundled_demo_dir() -> Path:
    """The demo model shipped inside the package (it may be absent in a source checkout)."""
    return Path(__file__).resolve().parent.parent / "demo" / "model"


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment now (not at import time)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        value = os.environ.get(var)
        if value:
            return Path(os.path.expandvars(value)).expanduser()
    home = os.environ.get("HF_HOME")
    if home:
        return Path(os.path.expandvars(home)).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def hub_repo_of(path: Path) -> str | None:
    """The repo id of a snapshot folder in the Hugging Face cache
    (`models--org--name/snapshots/<commit>` -> "org/name"), None for any other folder."""
    storage = path.resolve().parent.parent
    if path.resolve().parent.name != "snapshots" or not storage.name.startswith("models--"):
        return None
    return storage.name.removeprefix("models--").replace("--", "/")
