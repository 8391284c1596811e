"""The app as a node of a cluster: a real `exo-tui node` peer shows up live and its loss too."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from textual.widgets import Static

from exo_tui.app.main import ExoTuiApp
from exo_tui.app.widgets.chat import AnswerView, PromptInput, StatsLine
from exo_tui.app.widgets.nodes import NodeCard
from exo_tui.cluster.node import ClusterSetup, NodeOptions
from exo_tui.cluster.placement import Placement
from exo_tui.cluster.state import RunnerReady
from exo_tui.store.identity import ClusterKey, load_node_identity
from tests.app.helpers import fixed_stats, wait_until
from tests.cluster.node_process import KEY, StartNode

pytestmark = pytest.mark.anyio


async def test_a_peer_shows_up_live_can_be_placed_on_and_its_loss_is_shown(
    start: StartNode, tiny_llama: Path, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    shutil.copytree(tiny_llama, models / "tiny-llama")
    peer = start("peer")
    me = load_node_identity()
    setup = ClusterSetup(
        identity=me,
        key=ClusterKey(text=KEY),
        options=NodeOptions(port=0, mdns=False, peers=(peer.address,)),
    )
    app = ExoTuiApp(
        model="tiny-llama",
        models_dirs=[models],
        # Peers take stats only under the id their session proved.
        node_stats=lambda models: fixed_stats()(models).model_copy(update={"node_id": me.node_id}),
        bundled=False,
        cluster=setup,
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: len(app.query(NodeCard)) == 2, timeout=15)
        names = [n.name for n in app.state.nodes]
        assert names == ["studio", "peer"]
        assert app.state.nodes[1].stats.memory_total_bytes > 0
        # Launches stay on this node until the coordinator lands; F2 places on every node.
        await wait_until(pilot, lambda: isinstance(app.placement, Placement))
        assert isinstance(app.placement, Placement)
        assert app.placement.node_ids == (app.local_id,)
        await pilot.press("f2")
        await pilot.pause()
        assert app.state.chosen_nodes is None, app.state.chosen_nodes
        assert isinstance(app.placement, Placement)
        assert set(app.placement.node_ids) == {app.local_id, peer.node_id}
        peer.process.kill()
        await wait_until(pilot, lambda: not app.state.nodes[1].online, timeout=5)
        assert app.is_running


async def test_launch_across_two_nodes_streams_a_chat_and_a_lost_node_lets_you_place_again(
    start: StartNode, tiny_llama: Path, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    shutil.copytree(tiny_llama, models / "tiny-llama")
    peer = start("peer", "--models-dir", str(models))
    me = load_node_identity()
    setup = ClusterSetup(
        identity=me,
        key=ClusterKey(text=KEY),
        options=NodeOptions(port=0, mdns=False, peers=(peer.address,)),
    )
    app = ExoTuiApp(
        model="tiny-llama",
        models_dirs=[models],
        node_stats=lambda models: fixed_stats()(models).model_copy(update={"node_id": me.node_id}),
        bundled=False,
        cluster=setup,
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: len(app.state.online_nodes) == 2, timeout=15)
        await wait_until(pilot, lambda: app.card is not None)
        await pilot.press("f2")
        assert isinstance(app.placement, Placement) and app.placement.world_size == 2
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: app.state.instance_status == "ready", timeout=60)
        assert all(isinstance(n.runner, RunnerReady) for n in app.state.nodes)
        await pilot.click(PromptInput)
        await pilot.press(*"Hello there")
        await pilot.press("enter")
        await wait_until(pilot, lambda: bool(app.query(StatsLine)), timeout=60)
        assert app.query_one(AnswerView).text.strip()

        peer.process.kill()
        await wait_until(pilot, lambda: app.state.instance_status == "failed", timeout=5)
        assert "failed" in str(app.query_one("#launch-status", Static).content)
        # Place again on what is left (this node) and chat.
        await pilot.press("f2")
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: app.loaded is not None, timeout=30)
        assert app.state.instance_status == "ready"
