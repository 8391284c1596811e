"""Downloads from a local stand-in for the hub: progress, resume, integrity, offline, errors."""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from engine.loading import load_model_sync
from engine.models.finding import find_models
from engine.models.weights import shard_files
from exo_tui.hub.downloads import Downloading, download
from exo_tui.hub.errors import (
    DiskSpaceError,
    DownloadCancelled,
    HubOfflineError,
    RepoGatedError,
    RepoNotFoundError,
)
from exo_tui.hub.progress import DownloadProgress
from tests.hub_server import HubServer, git_blob_id, use_hub

REPO = "mlx-community/tiny-llama-4bit"
SHARDS = [f"model-{i:05d}-of-00004.safetensors" for i in range(1, 5)]


class Finished(NamedTuple):
    events: list[DownloadProgress]
    snapshot: Path


def run(downloading: Downloading, on_event: Callable[[DownloadProgress], None] = lambda _: None):
    events: list[DownloadProgress] = []
    while True:
        try:
            event = next(downloading)
        except StopIteration as done:
            return Finished(events, done.value)
        events.append(event)
        on_event(event)


@pytest.fixture(scope="module")
def tiny_sharded(tiny_model_factory: Callable[..., Path]) -> Path:
    """A 4-layer llama in four safetensors files, one layer each (embeddings in the first file,
    the final norm and head in the last)."""
    return tiny_model_factory("llama", shards=4)


@pytest.fixture
def hub(tiny_sharded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    with HubServer() as server:
        server.add_repo(REPO, tiny_sharded)
        use_hub(monkeypatch, server, tmp_path / "hf-home", tmp_path / "hf-cache")
        yield server


def file_sizes(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in folder.iterdir() if p.is_file()}


def same_files(snapshot: Path, source: Path, names: list[str] | None = None) -> bool:
    names = names or [p.name for p in source.iterdir() if p.is_file()]
    return all((snapshot / n).read_bytes() == (source / n).read_bytes() for n in names)


def test_full_download_reports_progress_to_the_total_and_loads(
    hub: HubServer, tiny_sharded: Path
) -> None:
    done = run(download(REPO))
    sizes = file_sizes(tiny_sharded)
    total = sum(sizes.values())
    last = done.events[-1]
    assert (last.bytes_done, last.bytes_total) == (total, total)
    assert (last.files_done, last.files_total) == (len(sizes), len(sizes))
    assert all(a.bytes_total == total for a in done.events)
    per_file = [e for e in done.events if e.file == SHARDS[0]]
    assert len(per_file) > 3  # bytes were reported as they landed, not once per file
    assert [e.file_bytes for e in per_file] == sorted(e.file_bytes for e in per_file)
    assert same_files(done.snapshot, tiny_sharded)
    assert hub.bytes_served() == total

    # The model is where the rest of exo-tui looks, and it loads.
    cards = [c for c in find_models([], include_bundled=False) if c.name == REPO]
    assert cards and cards[0].source == "hf_cache"
    assert Path(cards[0].path) == done.snapshot.resolve()
    loaded = load_model_sync(done.snapshot)
    assert loaded.card.num_layers == 4

    # A second download fetches nothing.
    hub.reset_counts()
    again = run(download(REPO))
    assert again.snapshot == done.snapshot and hub.bytes_served() == 0
    assert again.events[-1].bytes_done == total


def test_a_cut_connection_resumes_with_a_range_request(hub: HubServer, tiny_sharded: Path) -> None:
    size = (tiny_sharded / SHARDS[1]).stat().st_size
    hub.cut_next(SHARDS[1], after=size // 2)
    done = run(download(REPO, max_workers=1))
    assert same_files(done.snapshot, tiny_sharded)
    gets = [s for s in hub.served if s.file == SHARDS[1] and s.method == "GET"]
    assert [(s.start, s.sent) for s in gets[:1]] == [(0, size // 2)]
    # The second request continues from the last whole chunk written (httpx drops the tail
    # it buffered when the connection broke).
    (resumed,) = gets[1:]
    assert size // 2 - 4096 < resumed.start <= size // 2
    assert resumed.sent == size - resumed.start


def test_cancel_keeps_partial_files_and_the_next_run_fetches_only_the_rest(
    hub: HubServer, tiny_sharded: Path
) -> None:
    cancel = threading.Event()
    # The hub drops the first shard halfway, so a part of it surely arrives before the rest
    # (a whole small file can otherwise land in one read, leaving nothing partial to cancel).
    hub.cut_next(SHARDS[0], after=(tiny_sharded / SHARDS[0]).stat().st_size // 2)

    def cancel_midway(event: DownloadProgress) -> None:
        if event.file == SHARDS[0] and 0 < event.file_bytes < event.file_total:
            cancel.set()

    with pytest.raises(DownloadCancelled, match="resume"):
        run(download(REPO, cancel=cancel, max_workers=1), cancel_midway)
    cache = Path(hub_cache()) / f"models--{REPO.replace('/', '--')}" / "blobs"
    partials = {p.name: p.stat().st_size for p in cache.glob("*.incomplete")}
    assert partials and all(size > 0 for size in partials.values())
    left_by_run_one = {
        name: partials.get(f"{etag_of(tiny_sharded / name)}.incomplete", 0)
        for name in file_sizes(tiny_sharded)
    }
    hub.reset_counts()

    done = run(download(REPO))
    assert same_files(done.snapshot, tiny_sharded)
    # Files the first run finished are not fetched again; partial ones continue where they
    # stopped, with a Range request; the rest come whole.
    sizes = file_sizes(tiny_sharded)
    for name, size in sizes.items():
        gets = [(s.start, s.sent) for s in hub.served if s.file == name and s.method == "GET"]
        finished = (done.snapshot / name).exists() and name not in {s.file for s in hub.served}
        assert finished or gets == [(left_by_run_one[name], size - left_by_run_one[name])], name
    assert any(left_by_run_one.values()) and hub.bytes_served() < sum(sizes.values())
    assert not list(cache.glob("*.incomplete"))


def test_corrupt_bytes_from_the_hub_are_fetched_again(hub: HubServer, tiny_sharded: Path) -> None:
    size = (tiny_sharded / SHARDS[2]).stat().st_size
    hub.corrupt_next(SHARDS[2])
    done = run(download(REPO))
    assert same_files(done.snapshot, tiny_sharded)
    assert hub.bytes_served(SHARDS[2]) == 2 * size


def test_a_corrupted_or_truncated_file_in_the_cache_is_fetched_again(
    hub: HubServer, tiny_sharded: Path
) -> None:
    snapshot = run(download(REPO)).snapshot
    flipped = (snapshot / SHARDS[0]).resolve()
    data = bytearray(flipped.read_bytes())
    data[-1] ^= 0xFF
    flipped.write_bytes(bytes(data))
    truncated = (snapshot / "tokenizer.json").resolve()
    truncated.write_bytes(truncated.read_bytes()[:100])
    hub.reset_counts()

    run(download(REPO))
    assert same_files(snapshot, tiny_sharded)
    assert hub.bytes_served() == len(data) + (tiny_sharded / "tokenizer.json").stat().st_size


def test_offline_uses_the_cache_and_says_so_when_the_model_is_missing(
    hub: HubServer, tiny_sharded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubOfflineError, match="HF_HUB_OFFLINE") as error:
        run(download(REPO))
    assert "Unset HF_HUB_OFFLINE" in error.value.fix
    assert hub.api_calls == 0 and not hub.served

    monkeypatch.delenv("HF_HUB_OFFLINE")
    online = run(download(REPO)).snapshot
    hub.reset_counts()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    offline = run(download(REPO))
    assert offline.snapshot == online and offline.events == []
    assert hub.api_calls == 0 and not hub.served


def test_an_unreachable_endpoint_uses_the_cache_or_names_the_endpoint(
    hub: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = "http://127.0.0.1:9"  # discard port: nothing listens
    monkeypatch.setenv("HF_ENDPOINT", dead)
    with pytest.raises(HubOfflineError, match="127.0.0.1:9"):
        run(download(REPO))

    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    online = run(download(REPO)).snapshot
    monkeypatch.setenv("HF_ENDPOINT", dead)
    assert run(download(REPO)).snapshot == online


@pytest.mark.parametrize("status", [401, 403])
def test_a_gated_repo_says_to_accept_its_terms_and_set_a_token(
    hub: HubServer, tiny_sharded: Path, status: int
) -> None:
    hub.add_repo("meta-llama/gated", tiny_sharded, status="gated").gated_status = status
    with pytest.raises(RepoGatedError, match="gated") as error:
        run(download("meta-llama/gated"))
    assert "HF_TOKEN" in error.value.fix and "meta-llama/gated" in error.value.fix


def test_a_missing_repo_or_revision_is_named(hub: HubServer) -> None:
    with pytest.raises(RepoNotFoundError, match="No model repo mlx-community/nope"):
        run(download("mlx-community/nope"))
    with pytest.raises(RepoNotFoundError, match="no revision 'v9'"):
        run(download(REPO, revision="v9"))


def test_a_layer_range_fetches_only_its_shards_and_the_shared_files(
    hub: HubServer, tiny_sharded: Path
) -> None:
    done = run(download(REPO, layers=(1, 2), total_layers=4))
    served = {s.file for s in hub.served if s.sent}
    # Layer 1 is in the second file; every rank also needs the embeddings (first file) and
    # the final norm and head (last file). The third file holds only layer 2.
    assert SHARDS[2] not in served and not (done.snapshot / SHARDS[2]).exists()
    shared = [p.name for p in tiny_sharded.iterdir() if not p.name.endswith(".safetensors")]
    assert same_files(done.snapshot, tiny_sharded, [*shared, SHARDS[0], SHARDS[1], SHARDS[3]])
    assert done.events[-1].bytes_total == sum(
        (tiny_sharded / n).stat().st_size for n in [*shared, SHARDS[0], SHARDS[1], SHARDS[3]]
    )
    with pytest.raises(ValueError, match="not within"):
        run(download(REPO, layers=(2, 6), total_layers=4))


def test_shard_files_picks_layers_and_the_weights_outside_them() -> None:
    index: dict[str, Any] = {
        "weight_map": {
            "model.embed_tokens.weight": "a.safetensors",
            "model.layers.0.mlp.up_proj.weight": "a.safetensors",
            "model.layers.1.mlp.up_proj.weight": "b.safetensors",
            "model.layers.10.mlp.up_proj.weight": "c.safetensors",
            "model.layers.11.self_attn.q_proj.weight": "d.safetensors",
            "model.norm.weight": "d.safetensors",
            "lm_head.weight": "e.safetensors",
        }
    }
    assert shard_files(index, (1, 2)) == {"a.safetensors", "b.safetensors", "d.safetensors",
                                           "e.safetensors"}  # fmt: skip
    assert shard_files(index, (10, 11)) == {"a.safetensors", "c.safetensors", "d.safetensors",
                                            "e.safetensors"}  # fmt: skip
    with pytest.raises(ValueError):
        shard_files(index, (3, 3))


def test_the_disk_space_check_names_both_figures(
    hub: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = shutil.disk_usage(hub_cache_parent())
    monkeypatch.setattr(shutil, "disk_usage", lambda _: real._replace(free=50_000))
    with pytest.raises(DiskSpaceError, match=r"needs \d+\.\d MB more, but .* has 0\.1 MB free"):
        run(download(REPO))
    assert hub.bytes_served() == 0


def etag_of(path: Path) -> str:
    """The hub's ETag: sha256 for LFS files (safetensors here), else the git blob id."""
    data = path.read_bytes()
    if path.name.endswith(".safetensors"):
        return hashlib.sha256(data).hexdigest()
    return git_blob_id(data)


def hub_cache() -> str:
    import os

    return os.environ["HF_HUB_CACHE"]


def hub_cache_parent() -> Path:
    return Path(hub_cache()).parent


def test_index_fixture_is_sharded_as_the_tests_assume(tiny_sharded: Path) -> None:
    index = json.loads((tiny_sharded / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == SHARDS


def test_where_links_are_off_the_snapshot_holds_copies_and_a_second_run_fetches_nothing(
    hub: HubServer, tiny_sharded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_SYMLINKS", True)
    done = run(download(REPO))
    assert same_files(done.snapshot, tiny_sharded)
    assert not any(p.is_symlink() for p in done.snapshot.iterdir())
    hub.reset_counts()
    assert run(download(REPO)).snapshot == done.snapshot
    assert hub.bytes_served() == 0


def test_files_with_the_same_bytes_share_one_blob_and_all_land(
    tiny_sharded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Their hashes name one blob and one partial file: fetched at once, they spoiled it."""
    folder = shutil.copytree(tiny_sharded, tmp_path / "with-copies")
    for n in range(3):
        shutil.copy(folder / "tokenizer.json", folder / f"tokenizer-copy-{n}.json")
        shutil.copy(folder / SHARDS[1], folder / f"copy-{n}.safetensors")
    with HubServer() as server:
        server.add_repo(REPO, folder)
        use_hub(monkeypatch, server, tmp_path / "hf-home", tmp_path / "hf-cache")
        done = run(download(REPO))
        assert same_files(done.snapshot, folder)
        # Each distinct blob came down once.
        assert server.bytes_served() == sum(
            len(data) for data in {p.read_bytes() for p in folder.iterdir()}
        )
