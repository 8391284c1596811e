"""The TUI's cluster download: a catalogue model placed over this app and a real `exo-tui node`
peer; each node fetches only its share from a local hub at launch, with its own progress bar."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from textual.widgets import Label

from exo_tui.app.screens.download_confirm import DownloadConfirm
from exo_tui.app.widgets.chat import AnswerView, StatsLine
from exo_tui.app.widgets.nodes import NodeCard
from exo_tui.app.widgets.prompt import PromptInput
from exo_tui.cluster.control.placement import Placement
from exo_tui.cluster.control.state import ClusterEvent, DownloadProgressed, RunnerReady
from exo_tui.cluster.identity import load_node_identity
from tests.app.helpers import wait_until
from tests.app.test_app_cluster import app_with_peer, choose_every_node
from tests.app.test_app_download import catalogue_entry
from tests.cluster.node_process import StartNode
from tests.cluster.test_cluster_downloads import files_for, hub_env
from tests.hub_server import HubServer, use_hub

pytestmark = pytest.mark.anyio

REPO = "mlx-community/tiny-llama-shards"


@pytest.fixture
def sharded(tiny_model_factory) -> Path:  # type: ignore[no-untyped-def]
    return tiny_model_factory("llama", shards=4)


@pytest.fixture
def hub(sharded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    with HubServer() as server:
        server.add_repo(REPO, sharded)
        use_hub(monkeypatch, server, tmp_path / "app-hf", tmp_path / "app-hf" / "hub")
        yield server


def cached_shards(hf_home: Path) -> set[str]:
    folder = hf_home / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots"
    return {p.name for p in folder.glob("*/*.safetensors")}


async def test_each_node_downloads_its_share_with_a_bar_then_the_model_loads_and_chats(
    start: StartNode, sharded: Path, hub: HubServer, tmp_path: Path
) -> None:
    empty = tmp_path / "models"
    empty.mkdir()
    peer = start("peer", "--models-dir", str(empty), env=hub_env(hub, tmp_path / "peer-hf"))
    app = app_with_peer(peer, empty, catalogue=[catalogue_entry(sharded, REPO)])
    me = load_node_identity()
    seen: list[ClusterEvent] = []
    dispatch = app.dispatch

    def record(event: ClusterEvent) -> None:
        seen.append(event)
        dispatch(event)

    app.dispatch = record  # type: ignore[method-assign]
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: len(app.state.online_nodes) == 2, timeout=15)
        await choose_every_node(pilot)
        # No model on disk anywhere: the picker offers the catalogue's, and asks.
        await pilot.pause()
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: app.screen.__class__.__name__ == "ModelPicker")
        await pilot.press(*"shards", "enter")
        await wait_until(pilot, lambda: isinstance(app.screen, DownloadConfirm))
        keys = str(app.screen.query_one("#download-keys", Label).content)
        assert "each of the 2 nodes\ndownloads only the files of its layers" in keys
        await pilot.press("s")
        await wait_until(
            pilot, lambda: app.selection.card is not None and app.selection.card.name == REPO
        )
        assert (
            isinstance(app.selection.placement, Placement)
            and app.selection.placement.world_size == 2
        )
        ranges = {
            s.node_id: (s.spec.start_layer, s.spec.end_layer)
            for s in app.selection.placement.shards
        }

        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: app.state.instance_status == "ready", timeout=60)
        assert all(isinstance(n.runner, RunnerReady) for n in app.state.nodes)
        # Each node showed its own download, to the end of its share...
        downloads = [e for e in seen if isinstance(e, DownloadProgressed)]
        assert {e.node_id for e in downloads} == {me.node_id, peer.node_id}
        for node_id in (me.node_id, peer.node_id):
            last = [e for e in downloads if e.node_id == node_id][-1]
            assert last.progress.bytes_done == last.progress.bytes_total > 0
        # ...and fetched only the files of its layers.
        assert cached_shards(tmp_path / "app-hf") == files_for(*ranges[me.node_id])
        assert cached_shards(tmp_path / "peer-hf") == files_for(*ranges[peer.node_id])
        assert len(app.query(NodeCard)) == 2

        await pilot.click(PromptInput)
        await pilot.press(*"Hello there", "enter")
        await wait_until(pilot, lambda: bool(app.query(StatsLine)), timeout=60)
        assert app.query_one(AnswerView).text.strip()
    # Quitting the app stops the rank it ran for the instance (none left behind).
    assert not [
        child for child in psutil.Process().children()  # the peer node runs its own
        if "exo_tui.cluster.worker.runner" in " ".join(child.cmdline())
    ]  # fmt: skip
