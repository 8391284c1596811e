"""`exo-tui models download` and `exo-tui models` against a local stand-in for the hub."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cluster.node_process import KEY, StartNode
from tests.hub_server import HubServer

REPO = "mlx-community/tiny-llama-4bit"


@pytest.fixture
def hub_env(
    tiny_model_factory: Callable[..., Path], tmp_path: Path
) -> Iterator[tuple[HubServer, dict[str, str]]]:
    with HubServer() as hub:
        hub.add_repo(REPO, tiny_model_factory("llama", shards=4))
        hub.add_repo("meta-llama/gated", tiny_model_factory("llama", shards=4), status="gated")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
        env |= {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf"),
                "EXO_TUI_HOME": str(tmp_path / "exo")}  # fmt: skip
        yield hub, env


def exo_tui(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "exo_tui.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)


def test_download_json_then_models_lists_it(hub_env: tuple[HubServer, dict[str, str]]) -> None:
    hub, env = hub_env
    result = exo_tui(env, "models", "download", REPO, "--json")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    progress = [line for line in lines if line["type"] == "download"]
    assert progress[-1]["bytes_done"] == progress[-1]["bytes_total"] == hub.bytes_served()
    assert lines[-1]["type"] == "downloaded" and Path(lines[-1]["path"]).is_dir()

    listed = exo_tui(env, "models", "--json", "--models-dir", str(Path(env["HF_HOME"]) / "none"))
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    cards = [r for r in rows if "type" not in r]
    assert [c["name"] for c in cards if c["source"] == "hf_cache"] == [REPO]
    catalogue = [r for r in rows if r.get("type") == "catalogue"]
    assert len(catalogue) >= 12 and not any(r["downloaded"] for r in catalogue)

    text = exo_tui(env, "models", "--models-dir", str(Path(env["HF_HOME"]) / "none"))
    assert REPO in text.stdout and "Catalogue" in text.stdout and "not downloaded" in text.stdout


def test_download_with_bars_and_clean_errors(hub_env: tuple[HubServer, dict[str, str]]) -> None:
    _, env = hub_env
    result = exo_tui(env, "models", "download", REPO, "--layers", "0:2")
    assert result.returncode == 0, result.stderr
    assert "is in" in result.stderr and "Traceback" not in result.stderr

    gated = exo_tui(env, "models", "download", "meta-llama/gated")
    assert gated.returncode == 2 and "gated" in gated.stderr and "HF_TOKEN" in gated.stderr
    assert "Traceback" not in gated.stderr
    bad = exo_tui(env, "models", "download", REPO, "--layers", "3")
    assert bad.returncode == 2 and "START:END" in bad.stderr


def test_models_says_whether_each_catalogue_model_fits_this_machine_or_the_cluster(
    hub_env: tuple[HubServer, dict[str, str]], start: StartNode
) -> None:
    _, env = hub_env
    listed = exo_tui(env, "models", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    catalogue = {r["name"]: r for r in rows if r.get("type") == "catalogue"}
    small = catalogue["mlx-community/Llama-3.2-1B-Instruct-4bit"]
    assert small["fits"] and small["fit"] == "fits (pipeline)"
    huge = catalogue["mlx-community/Qwen3-235B-A22B-4bit"]
    assert not huge["fits"] and "does not fit" in huge["fit"]

    peer = start("peer")
    text = exo_tui(env, "models", "--cluster", "--no-mdns", "--port", "0", "--key", KEY,
                   "--peer", peer.address, "--discover", "2")  # fmt: skip
    assert text.returncode == 0, text.stderr
    assert "fit on the 2 nodes found" in text.stdout
    assert "Qwen3-235B-A22B-4bit" in text.stdout and "does not fit (pipeline over 2" in text.stdout
