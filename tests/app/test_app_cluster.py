"""The app as a node of a cluster: a real `exo-tui node` peer shows up live and its loss too."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import SelectionList, Static

from exo_tui.app.main import ExoTuiApp
from exo_tui.app.screens.nodes import NodesScreen
from exo_tui.app.widgets.chat import AnswerView, ErrorLine, StatsLine
from exo_tui.app.widgets.nodes import NodeCard
from exo_tui.app.widgets.prompt import PromptInput
from exo_tui.cluster.control.placement import Placement
from exo_tui.cluster.control.state import RunnerReady
from exo_tui.cluster.identity import ClusterKey, load_node_identity
from exo_tui.cluster.node import ClusterSetup, NodeOptions
from tests.app.helpers import fixed_stats, wait_until
from tests.cluster.node_process import FOREIGN_KEY, KEY, NodeProcess, StartNode

pytestmark = pytest.mark.anyio


def app_with_peer(peer: NodeProcess, models_dir: Path, **options: Any) -> ExoTuiApp:
    """The app as a node of the cluster that dials `peer`, with fixed stats under its own node
    id (peers take stats only under the id their session proved)."""
    me = load_node_identity()
    setup = ClusterSetup(
        identity=me,
        key=ClusterKey(text=KEY),
        options=NodeOptions(port=0, mdns=False, peers=(peer.address,)),
    )
    return ExoTuiApp(
        models_dirs=[models_dir],
        node_stats=lambda models: fixed_stats()(models).model_copy(update={"node_id": me.node_id}),
        bundled=False,
        cluster=setup,
        **options,
    )


async def choose_every_node(pilot) -> None:  # type: ignore[no-untyped-def]
    await pilot.press("f2")
    await wait_until(pilot, lambda: isinstance(pilot.app.screen, NodesScreen))
    await pilot.press("a", "enter")
    await wait_until(pilot, lambda: not isinstance(pilot.app.screen, NodesScreen))


async def test_the_node_chooser_sets_the_ring_order(tiny_llama: Path, tmp_path: Path) -> None:
    from exo_tui.cluster.control.state import NodeSeen

    app = ExoTuiApp(
        model="tiny-llama", models_dirs=[tiny_llama.parent], node_stats=fixed_stats(),
        bundled=False,
    )  # fmt: skip
    async with app.run_test(size=(120, 40)) as pilot:
        other = fixed_stats()(()).model_copy(update={"node_id": "node-b", "name": "laptop"})
        app.dispatch(NodeSeen(stats=other, at=0.0))
        await pilot.press("f2")
        await wait_until(pilot, lambda: isinstance(app.screen, NodesScreen))
        # Untick both, tick laptop then studio: the ring follows the order ticked.
        await pilot.press("space", "down", "space")
        await pilot.press("space", "up", "space", "enter")
        await wait_until(pilot, lambda: not isinstance(app.screen, NodesScreen))
        assert app.selection.chosen_nodes == ("node-b", "node-a")
        await pilot.press("f2", "escape")  # cancelling changes nothing
        assert app.selection.chosen_nodes == ("node-b", "node-a")


async def test_a_peer_shows_up_live_can_be_placed_on_and_its_loss_is_shown(
    start: StartNode, tiny_llama: Path, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    shutil.copytree(tiny_llama, models / "tiny-llama")
    peer = start("peer")
    app = app_with_peer(peer, models, model="tiny-llama")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: len(app.query(NodeCard)) == 2, timeout=15)
        names = [n.name for n in app.state.nodes]
        assert names == ["studio", "peer"]
        assert app.state.nodes[1].stats.memory_total_bytes > 0
        # A model is placed on this node alone at first; F2 chooses nodes (A ticks all).
        await wait_until(pilot, lambda: isinstance(app.selection.placement, Placement))
        assert isinstance(app.selection.placement, Placement)
        assert app.selection.placement.node_ids == (app.local_id,)
        await choose_every_node(pilot)
        assert app.selection.chosen_nodes is None, app.selection.chosen_nodes
        assert isinstance(app.selection.placement, Placement)
        assert set(app.selection.placement.node_ids) == {app.local_id, peer.node_id}
        peer.process.kill()
        await wait_until(pilot, lambda: not app.state.nodes[1].online, timeout=5)
        assert app.is_running


async def test_launch_across_two_nodes_streams_a_chat_and_a_lost_node_lets_you_place_again(
    start: StartNode, tiny_llama: Path, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    shutil.copytree(tiny_llama, models / "tiny-llama")
    peer = start("peer", "--models-dir", str(models))
    app = app_with_peer(peer, models, model="tiny-llama")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: len(app.state.online_nodes) == 2, timeout=15)
        await wait_until(pilot, lambda: app.selection.card is not None)
        await choose_every_node(pilot)
        assert (
            isinstance(app.selection.placement, Placement)
            and app.selection.placement.world_size == 2
        )
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
        # Place again on what is left: the chooser lists only online nodes.
        await pilot.press("f2")
        await wait_until(pilot, lambda: isinstance(app.screen, NodesScreen))
        assert app.screen.query_one(SelectionList).option_count == 1
        await pilot.press("enter")
        await pilot.press("ctrl+l")
        # The model answers (its backend set first), and its node says so a message later.
        await wait_until(pilot, lambda: app.conversation.backend is not None, timeout=30)
        await wait_until(pilot, lambda: app.state.instance_status == "ready", timeout=10)


async def test_a_request_error_on_the_cluster_is_shown_in_the_chat(
    start: StartNode, tiny_model_factory: Callable[..., Path], tmp_path: Path
) -> None:
    models = tmp_path / "models"
    # 64 tokens of context: the built-in tools' schemas alone are longer.
    shutil.copytree(tiny_model_factory("llama", max_position_embeddings=64), models / "short")
    peer = start("peer", "--models-dir", str(models))
    app = app_with_peer(peer, models, model="short")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: len(app.state.online_nodes) == 2, timeout=15)
        await wait_until(pilot, lambda: app.selection.card is not None)
        await choose_every_node(pilot)
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: app.state.instance_status == "ready", timeout=60)
        await pilot.click(PromptInput)
        await pilot.press(*"Hello there")
        await pilot.press("enter")
        await wait_until(pilot, lambda: bool(app.query(ErrorLine)), timeout=60)
        shown = str(app.query_one(ErrorLine).content)
        assert "holds at most 64" in shown and "new chat" in shown, shown
        assert app.state.instance_status == "ready"  # only the request failed
        await wait_until(pilot, lambda: not app.conversation.generating)
        assert app.query_one(PromptInput).text == "Hello there"  # back in the prompt, to change
        assert "Hello there" not in [m.content for m in app.conversation.messages]


async def test_a_peer_with_another_key_is_shown_as_foreign(
    start: StartNode, tiny_llama: Path, tmp_path: Path
) -> None:
    stranger = start("stranger", key=FOREIGN_KEY)
    app = app_with_peer(stranger, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: bool(app.state.foreign), timeout=15)
        assert app.state.foreign[0].name == "stranger"
        assert app.state.foreign[0].fingerprint == stranger.fingerprint
        assert [n.name for n in app.state.nodes] == ["studio"]  # never a node
        await pilot.pause()
        shown = str(app.query_one("#foreign", Static).content)
        assert "stranger" in shown and "refused" in shown
