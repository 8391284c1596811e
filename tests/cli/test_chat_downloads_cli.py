"""`exo-tui chat --model REPO` for a catalogue model that is not on disk: alone it downloads the
model first; with `--cluster` each node fetches only its share. A local hub stands in for
Hugging Face, and a user catalogue (EXO_TUI_CATALOGUE) lists the tiny model under REPO."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from exo_tui.hub.catalogue import CatalogueEntry, parse_catalogue
from tests.app.test_app_download import catalogue_entry
from tests.cluster.node_process import KEY, ROOT, StartNode
from tests.hub_server import HubServer

REPO = "mlx-community/tiny-llama-shards"
SHARDS = [f"model-{i:05d}-of-00004.safetensors" for i in range(1, 5)]


def catalogue_toml(entry: CatalogueEntry) -> str:
    """The entry as a catalogue file holds it (TOML strings are JSON strings here)."""
    lines = ["[[model]]"]
    for key, value in entry.model_dump(exclude_none=True).items():
        lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


@pytest.fixture
def env(tiny_model_factory: Callable[..., Path], tmp_path: Path) -> Iterator[dict[str, str]]:
    sharded = tiny_model_factory("llama", shards=4)
    catalogue = tmp_path / "my-models.toml"
    catalogue.write_text(catalogue_toml(catalogue_entry(sharded, REPO)))
    assert parse_catalogue(catalogue.read_text())[0].repo == REPO
    with HubServer() as hub:
        hub.add_repo(REPO, sharded)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
        yield base | {
            "HF_ENDPOINT": hub.endpoint,
            "HF_HOME": str(tmp_path / "hf"),
            "EXO_TUI_HOME": str(tmp_path / "exo"),
            "EXO_TUI_CATALOGUE": str(catalogue),
        }


def chat(env: dict[str, str], *args: str) -> list[dict[str, Any]]:
    command = [sys.executable, "-m", "exo_tui.cli", "chat", "--model", REPO, "--json",
               "--prompt", "hello", "--max-tokens", "8", "--temperature", "0", "--no-tools",
               *args]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_a_catalogue_model_downloads_then_loads_and_answers(env: dict[str, str]) -> None:
    lines = chat(env)
    kinds = [line["type"] for line in lines]
    # Download, then load, then the answer, in that order.
    assert kinds.index("downloaded") < kinds.index("load") < kinds.index("done")
    progress = [line for line in lines if line["type"] == "download"]
    assert progress[-1]["bytes_done"] == progress[-1]["bytes_total"] > 0
    assert {line["file"] for line in progress} >= set(SHARDS)
    # On disk now: the next chat downloads nothing.
    again = chat(env)
    assert "download" not in [line["type"] for line in again]
    assert again[-1]["type"] == "done"


def test_on_a_cluster_each_node_fetches_its_share(
    env: dict[str, str], start: StartNode, tmp_path: Path
) -> None:
    peers = []
    for name in ("n0", "n1"):
        empty = tmp_path / f"{name}-models"
        empty.mkdir()
        node_env = env | {"HF_HOME": str(tmp_path / f"{name}-hf")}
        peers.append(start(name, "--models-dir", str(empty), env=node_env))
    args = ["--cluster", "--no-mdns", "--port", "0", "--key", KEY, "--discover", "2",
            "--nodes", ",".join(p.node_id for p in peers)]  # fmt: skip
    for peer in peers:
        args += ["--peer", peer.address]
    lines = chat(env | {"EXO_TUI_HOME": str(tmp_path / "coordinator")}, *args)
    downloads = [line for line in lines if line["type"] == "download"]
    assert {line["node"] for line in downloads} == {"n0", "n1"}
    for name in ("n0", "n1"):
        last = [line for line in downloads if line["node"] == name][-1]
        assert last["bytes_done"] == last["bytes_total"] > 0
        snapshots = tmp_path / f"{name}-hf" / "hub" / f"models--{REPO.replace('/', '--')}"
        files = {p.name for p in snapshots.glob("snapshots/*/*.safetensors")}
        assert len(files) == 3 and {SHARDS[0], SHARDS[3]} <= files  # its layer's file + ends
    kinds = [line["type"] for line in lines]
    assert kinds.index("download") < kinds.index("load") and kinds[-1] == "done"
    # The coordinator itself held no rank, so it downloaded nothing.
    assert not (tmp_path / "hf" / "hub").exists() or not any(
        (tmp_path / "hf").rglob("*.safetensors")
    )


@pytest.mark.parametrize("named_by", ["path", "name in a models dir"])
def test_a_local_folder_missing_a_shard_names_the_file_and_asks_no_hub(
    tiny_model_factory: Callable[..., Path], tmp_path: Path, named_by: str
) -> None:
    models = tmp_path / "models"
    folder = shutil.copytree(tiny_model_factory("llama", shards=4), models / "tiny")
    (folder / SHARDS[1]).unlink()
    model = [str(folder)] if named_by == "path" else ["tiny", "--models-dir", str(models)]
    with HubServer() as hub:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
        env = base | {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf"),
                      "EXO_TUI_HOME": str(tmp_path / "exo")}  # fmt: skip
        command = [sys.executable, "-m", "exo_tui.cli", "chat", "--model", *model,
                   "--prompt", "hello", "--max-tokens", "4", "--no-tools"]  # fmt: skip
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=180, env=env, cwd=ROOT
        )
        assert hub.api_calls == 0 and not hub.served
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    assert SHARDS[1] in result.stderr and str(folder) in result.stderr, result.stderr
    assert "HTTP" not in result.stderr
    assert f"Copy {SHARDS[1]} into {folder}" in result.stderr
