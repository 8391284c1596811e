"""The Hugging Face cache's layout: where the hub and the cache are, each repo's folder, the
paths written in it (each checked to stay inside), and what the cache alone can give offline."""
# pyright: strict

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engine.models.locations import hf_cache_dir
from engine.models.weights import missing_weight_files
from exo_tui.hub.errors import HubOfflineError, OutsideCacheError
from exo_tui.hub.names import as_commit

DEFAULT_ENDPOINT = "https://huggingface.co"


def repo_folder(repo_id: str, cache_dir: Path | None = None) -> Path:
    """Where the Hugging Face cache (by default the one the environment names) keeps a model
    repo: blobs/, refs/ and snapshots/ live in it."""
    return (cache_dir or hf_cache_dir()) / ("models--" + repo_id.replace("/", "--"))


def _is_true(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


@dataclass(frozen=True)
class HubSettings:
    """The hub endpoint, the cache folder and offline mode, as the environment says now."""

    endpoint: str
    cache_dir: Path
    offline: bool

    @classmethod
    def from_env(cls) -> HubSettings:
        endpoint = os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
        offline = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
        return cls(endpoint.rstrip("/"), hf_cache_dir(), _is_true(offline))

    def storage(self, repo_id: str) -> Path:
        """The cache's folder for a model repo: blobs/, refs/ and snapshots/ live in it."""
        return repo_folder(repo_id, self.cache_dir)


def inside_storage(storage: Path, path: Path, *, through_link: bool = False) -> Path:
    """`path`, once it is sure to resolve inside `storage` (the repo's cache folder): its folder,
    or with `through_link` the path itself, since writing into a link writes where it points."""
    resolved = path.resolve() if through_link else path.parent.resolve() / path.name
    root = storage.resolve()
    if not resolved.is_relative_to(root):
        raise OutsideCacheError(
            f"{path} resolves to {resolved}, outside the cache's folder {root}: "
            "a link inside it points out",
            "Remove that link; to keep the cache on another disk, point HF_HUB_CACHE there",
        )
    return path


def write_ref(storage: Path, revision: str, commit: str) -> None:
    """Record which commit a branch or tag named, as huggingface_hub does (refs/<revision>)."""
    if revision == commit:
        return
    ref = inside_storage(storage, storage / "refs" / revision)
    ref.parent.mkdir(parents=True, exist_ok=True)
    if ref.is_file() and ref.read_text() == commit:
        return
    tmp = inside_storage(storage, ref.with_name(f".{ref.name}.tmp"), through_link=True)
    tmp.write_text(commit)
    os.replace(tmp, ref)


def cached_snapshot(
    repo_id: str,
    revision: str,
    settings: HubSettings,
    layers: tuple[int, int] | None,
    why_not_online: HubOfflineError,
) -> Path:
    """The cached snapshot of `revision` when it holds the weights asked for; else the error."""
    storage = settings.storage(repo_id)
    commit = as_commit(revision)
    ref = storage / "refs" / revision
    if commit is None and ref.is_file():
        commit = as_commit(ref.read_text().strip())  # older tools wrote what the hub said
    snapshot = storage / "snapshots" / (commit or "-")
    if commit is None or not (snapshot / "config.json").is_file():
        raise why_not_online
    missing = missing_weight_files(snapshot, layers)
    if not missing and not any(snapshot.glob("*.safetensors")):
        missing = ["model.safetensors"]
    if missing:
        raise HubOfflineError(
            f"{why_not_online.cause}; the cache holds only part of {repo_id} "
            f"({len(missing)} weight files missing, e.g. {missing[0]})",
            why_not_online.fix,
        )
    return snapshot
