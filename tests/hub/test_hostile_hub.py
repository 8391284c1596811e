"""A hub that lies about a repo's files never gets a byte written outside the cache.

Every name the hub sends becomes a path only once checked: a hash is 40 or 64 hex characters, a
file name a relative path inside the repo. A lie fails the download with an error that names
the repo and the field, and everything outside the repo's cache folder is as it was.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from exo_tui.hub.downloads import download
from exo_tui.hub.errors import DownloadError
from exo_tui.hub.remote import HubAnswerError
from tests.hostile_hub import HostileHub, climb_to, tree_outside
from tests.hub.test_downloads import SHARDS, run, same_files
from tests.hub_server import use_hub

REPO = "mlx-community/tiny-llama-4bit"
VICTIM = b"a file of the user's, outside the cache\n"


class Scene(NamedTuple):
    hub: HostileHub
    root: Path  # everything the test may touch
    cache: Path  # HF_HUB_CACHE
    storage: Path  # the repo's folder in it
    victim: Path  # a file outside the cache that a lie aims at
    source: Path  # the model the hub serves


@pytest.fixture(scope="module")
def tiny_sharded(tiny_model_factory: Callable[..., Path]) -> Path:
    return tiny_model_factory("llama", shards=4)


@pytest.fixture
def scene(tiny_sharded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Scene]:
    cache = tmp_path / "hf-cache"
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    with HostileHub() as hub:
        hub.add_repo(REPO, tiny_sharded)
        use_hub(monkeypatch, hub, tmp_path / "hf-home", cache)
        storage = cache / f"models--{REPO.replace('/', '--')}"
        yield Scene(hub, tmp_path, cache, storage, victim, tiny_sharded)


def refused(scene: Scene, field: str) -> HubAnswerError:
    """Download, expect the refusal that names the repo and `field`, and check that nothing
    outside the repo's cache folder changed."""
    before = tree_outside(scene.root, scene.storage)
    with pytest.raises(HubAnswerError) as caught:
        run(download(REPO))
    assert REPO in caught.value.cause and field in caught.value.cause, caught.value
    assert "HF_ENDPOINT" in caught.value.fix
    assert tree_outside(scene.root, scene.storage) == before
    assert scene.victim.read_bytes() == VICTIM
    return caught.value


# ------------------------------------------------------------------------------ hashes


def aims(scene: Scene) -> dict[str, str]:
    """Hashes that are paths: from blobs/ (and the verified markers, one level down as well)
    up to the victim, the victim's absolute path, and other non-hashes."""
    return {
        "climbs": climb_to(scene.victim, scene.storage / "blobs"),
        "absolute": str(scene.victim),
        "nul": "a" * 39 + "\0",
        "backslash": "..\\..\\..\\victim.txt",
        "not hex": "z" * 64,
        "too short": "ab" * 10,
        "hex and more": "a" * 64 + "/x",
        "empty": "",
    }


AIMS = ["climbs", "absolute", "nul", "backslash", "not hex", "too short", "hex and more", "empty"]


def test_a_sha256_that_climbs_out_of_the_cache_does_not_overwrite_the_file_it_names(
    scene: Scene,
) -> None:
    """The whole attack: the blob's name climbs to the victim, and no other hash is given to
    check the bytes against."""
    scene.hub.lie_about(SHARDS[0], "lfs.sha256", climb_to(scene.victim, scene.storage / "blobs"))
    scene.hub.lie_about(SHARDS[0], "blobId", None)
    refused(scene, "lfs.sha256")


@pytest.mark.parametrize("aim", AIMS)
def test_an_lfs_sha256_that_is_not_a_hash_is_refused(scene: Scene, aim: str) -> None:
    scene.hub.lie_about(SHARDS[0], "lfs.sha256", aims(scene)[aim])
    refused(scene, "lfs.sha256")


@pytest.mark.parametrize("aim", AIMS)
def test_a_blob_id_that_is_not_a_hash_is_refused(scene: Scene, aim: str) -> None:
    scene.hub.lie_about("config.json", "blobId", aims(scene)[aim])
    refused(scene, "blobId")


def test_a_sha256_that_is_not_hex_is_not_taken_on_size_alone(scene: Scene) -> None:
    """Bytes of the right length but wrong content, under a "hash" that cannot be checked."""
    scene.hub.lie_about(SHARDS[1], "lfs.sha256", "g" * 64)
    scene.hub.corrupt_next(SHARDS[1], times=5)
    refused(scene, "lfs.sha256")
    assert not list(scene.cache.rglob(SHARDS[1]))


def test_a_file_without_any_hash_is_refused(scene: Scene) -> None:
    scene.hub.lie_about("tokenizer.json", "blobId", None)
    refused(scene, "blobId")


@pytest.mark.parametrize("size", [-1, "12", 1.5, True, None])
def test_a_size_that_is_not_a_byte_count_is_refused(scene: Scene, size: object) -> None:
    scene.hub.lie_about("config.json", "size", size)
    refused(scene, "size")


# ------------------------------------------------------------------------------ names


def names(scene: Scene) -> dict[str, str]:
    """File names that leave the snapshot folder, or are not one relative path."""
    snapshot = scene.storage / "snapshots" / scene.hub.repos[REPO].commit
    return {
        "climbs": climb_to(scene.victim, snapshot),
        "climbs midway": "sub/../../../../../victim.txt",
        "absolute": str(scene.victim),
        "backslash": "..\\..\\..\\..\\victim.txt",
        "nul": "config.json\0.txt",
        "empty": "",
        "dot": "./config.json",
        "empty part": "sub//config.json",
    }


NAMES = ["climbs", "climbs midway", "absolute", "backslash", "nul", "empty", "dot", "empty part"]


@pytest.mark.parametrize("name", NAMES)
def test_a_file_name_outside_the_repo_is_refused(scene: Scene, name: str) -> None:
    scene.hub.rename(REPO, "config.json", names(scene)[name])
    refused(scene, "rfilename")


@pytest.mark.parametrize("name", ["climbs", "absolute"])
def test_a_shard_name_outside_the_repo_is_refused(scene: Scene, name: str) -> None:
    scene.hub.rename(REPO, SHARDS[2], names(scene)[name])
    refused(scene, "rfilename")


def test_a_file_listed_twice_is_refused(scene: Scene) -> None:
    def twice(info: dict[str, object]) -> dict[str, object]:
        siblings = info["siblings"]
        assert isinstance(siblings, list)
        return info | {"siblings": [*siblings, siblings[0]]}

    scene.hub.answer_info(twice)
    refused(scene, "rfilename")


# ------------------------------------------------------------------------------ the commit


@pytest.mark.parametrize(
    "commit", ["../../../victim.txt", "/tmp", "main", "f" * 39, "f" * 40 + "\0", 40, None]
)
def test_a_commit_that_is_not_a_commit_hash_is_refused(scene: Scene, commit: object) -> None:
    scene.hub.lie_about_commit(commit)
    refused(scene, "sha")


# ------------------------------------------------------------------------------ malformed


@pytest.mark.parametrize(
    "answer",
    [
        lambda info: [info],
        lambda info: {"sha": info["sha"], "siblings": [{"size": 3}]},
        lambda info: {"sha": info["sha"], "siblings": 7},
        lambda info: {"sha": info["sha"], "siblings": [{"rfilename": 7, "blobId": "a" * 40}]},
        lambda info: {"sha": info["sha"], "siblings": [{"rfilename": "x", "lfs": {"size": 1}}]},
        lambda info: "not a model info",
    ],
    ids=[
        "a list",
        "no rfilename",
        "siblings a number",
        "a number as name",
        "lfs without hash",
        "a string",
    ],  # fmt: skip
)
def test_a_model_info_of_the_wrong_shape_is_refused(
    scene: Scene, answer: Callable[[dict[str, object]], object]
) -> None:
    scene.hub.answer_info(answer)
    before = tree_outside(scene.root, scene.storage)
    with pytest.raises(HubAnswerError) as caught:
        run(download(REPO))
    assert REPO in caught.value.cause and "HF_ENDPOINT" in caught.value.fix
    assert tree_outside(scene.root, scene.storage) == before


# ------------------------------------------------------------------------------ headers


def test_lying_file_headers_change_nothing(scene: Scene) -> None:
    """The model info is honest, the answers about each file name paths as their ETag and
    commit: the files still land in the cache, verified against the model info."""
    planted = scene.root / "planted.txt"
    blobs = scene.storage / "blobs"
    for name in scene.hub.repos[REPO].files:
        scene.hub.lie_in_headers(
            name,
            ETag=f'"{climb_to(planted, blobs)}"',
            X_Linked_Etag=f'"{climb_to(planted, blobs)}"',
            X_Repo_Commit=climb_to(planted, scene.storage / "snapshots"),
        )
    before = tree_outside(scene.root, scene.storage)
    done = run(download(REPO))
    assert same_files(done.snapshot, scene.source)
    assert not planted.exists()
    assert tree_outside(scene.root, scene.storage) == before
    storage = scene.storage.resolve()
    for path in done.snapshot.iterdir():
        assert storage in path.resolve().parents, path


# ------------------------------------------------------------------------------ links


def test_a_link_inside_the_cache_that_points_out_of_it_is_not_written_through(
    scene: Scene,
) -> None:
    outside = scene.root / "elsewhere"
    outside.mkdir()
    scene.storage.mkdir(parents=True)
    (scene.storage / "blobs").symlink_to(outside)
    with pytest.raises(DownloadError) as caught:
        run(download(REPO))
    assert "outside" in caught.value.cause and str(scene.storage / "blobs") in caught.value.cause
    assert list(outside.iterdir()) == []


# ------------------------------------------------------------------------------ the caller's


@pytest.mark.parametrize("revision", ["../../../victim", "/etc", "a\\b", "v1\0", ""])
def test_a_revision_that_is_not_a_ref_name_is_refused_before_asking(
    scene: Scene, revision: str
) -> None:
    with pytest.raises(DownloadError, match="revision") as caught:
        run(download(REPO, revision=revision))
    assert REPO in caught.value.cause
    assert scene.hub.api_calls == 0


@pytest.mark.parametrize("repo_id", ["../../victim", "/etc/x", "org/../../x", "org/na\0me"])
def test_a_repo_id_that_is_not_one_is_refused_before_asking(scene: Scene, repo_id: str) -> None:
    before = tree_outside(scene.root, scene.storage)
    with pytest.raises(DownloadError, match="repo id"):
        run(download(repo_id))
    assert scene.hub.api_calls == 0
    assert tree_outside(scene.root, scene.storage) == before


def test_an_honest_hub_still_downloads(scene: Scene) -> None:
    done = run(download(REPO))
    assert same_files(done.snapshot, scene.source)
    assert os.path.commonpath([done.snapshot, scene.cache]) == str(scene.cache)


@pytest.mark.parametrize(
    "index", [b"not json", b"[1, 2]", b'{"weight_map": 5}', b"\xff\xfe"], ids=repr
)
def test_an_index_that_is_not_a_weight_index_fails_a_layer_range_by_name(
    scene: Scene, index: bytes
) -> None:
    """The hub serves the bytes its own hash says: a broken repo, not a lying answer."""
    scene.hub.repos[REPO].files["model.safetensors.index.json"] = index
    with pytest.raises(DownloadError) as caught:
        run(download(REPO, layers=(0, 2), total_layers=4))
    assert REPO in caught.value.cause and "model.safetensors.index.json" in caught.value.cause
    assert "without --layers" in caught.value.fix
