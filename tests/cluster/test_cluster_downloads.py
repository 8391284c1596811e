"""Each node of a pipeline fetches only its share of a hub model, then the ring loads and chats.

Real `exo-tui node` processes, each with its own Hugging Face cache, download from a local
server that behaves like the hub (tests/hub_server.py); the coordinator is a Node in this
process, as in the TUI.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import anyio
import psutil
import pytest

from engine.generate import generate
from engine.loading import load_model_sync
from engine.models.cards import read_card
from engine.types import DoneChunk, ModelCard
from exo_tui.cluster.control.coordinator import plan_fetches
from exo_tui.cluster.control.placement import Placement
from exo_tui.cluster.control.state import DownloadProgressed, LoadProgressed, LoadStarted, NodeStats
from exo_tui.cluster.errors import ClusterError
from tests.cluster.node_process import NodeProcess, StartNode
from tests.cluster.test_coordinator import REQUEST, Coordinating, collect, runner_pids
from tests.hostile_hub import HostileHub, climb_to, tree_outside
from tests.hub_server import HubServer

pytestmark = pytest.mark.anyio

REPO = "mlx-community/tiny-llama-4bit"
# tiny_model_factory("llama", shards=4): one layer per file; the embeddings are in the first
# file, the final norm and head in the last. Every pipeline rank needs the first and last.
SHARDS = [f"model-{i:05d}-of-00004.safetensors" for i in range(1, 5)]


@pytest.fixture(scope="module")
def sharded(tiny_model_factory) -> Path:  # type: ignore[no-untyped-def]
    return tiny_model_factory("llama", shards=4)


@pytest.fixture
def hub(sharded: Path) -> Iterator[HubServer]:
    with HubServer() as server:
        server.add_repo(REPO, sharded)
        yield server


def hub_env(hub: HubServer, home: Path) -> dict[str, str]:
    """A node's own Hugging Face cache, reaching the test hub."""
    return {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(home), "HF_HUB_CACHE": str(home / "hub")}


def start_fetcher(start: StartNode, hub: HubServer, tmp_path: Path, name: str) -> NodeProcess:
    empty = tmp_path / f"{name}-models"
    empty.mkdir()
    return start(name, "--models-dir", str(empty), env=hub_env(hub, tmp_path / f"{name}-hf"))


def snapshot_files(tmp_path: Path, name: str) -> set[str]:
    snapshots = tmp_path / f"{name}-hf" / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots"
    return {p.name for p in snapshots.glob("*/*.safetensors")}


def files_for(start: int, end: int) -> set[str]:
    """One layer per file; every rank also needs the first (embeddings) and last (head)."""
    return {SHARDS[0], SHARDS[3], *(SHARDS[layer] for layer in range(start, end))}


def hub_card(sharded: Path) -> ModelCard:
    """What the TUI places for a catalogue model: a hub repo, on no node's disk yet."""
    return read_card(sharded, "hf_cache", name=REPO)


def shares(placement: Placement) -> dict[str, tuple[int, int]]:
    return {s.node_id: (s.spec.start_layer, s.spec.end_layer) for s in placement.shards}


async def test_each_node_fetches_only_its_layers_then_the_ring_matches_one_process(
    start: StartNode, hub: HubServer, sharded: Path, tmp_path: Path
) -> None:
    nodes = [start_fetcher(start, hub, tmp_path, name) for name in ("n0", "n1")]
    cluster = Coordinating(nodes)
    card = hub_card(sharded)
    expected = list(generate(load_model_sync(sharded), REQUEST))[-1]
    assert isinstance(expected, DoneChunk)
    async with anyio.create_task_group() as tasks:
        placement = await cluster.start_and_place(tasks, card)
        # Two nodes on one machine: two layers each (which node comes first is a race).
        ranges = shares(placement)
        assert sorted(ranges.values()) == [(0, 2), (2, 4)]
        fetches = plan_fetches(placement, card, [n.stats for n in cluster.state.nodes])
        assert fetches == ranges
        await cluster.node.coordinator.launch(placement, card, fetches=fetches)
        # Each cache holds its layers' files plus the first and last (embeddings, head).
        for node, name in zip(nodes, ("n0", "n1"), strict=True):
            assert snapshot_files(tmp_path, name) == files_for(*ranges[node.node_id])
        # Every node's download was shown, up to its whole share.
        progress = [e for e in cluster.events if isinstance(e, DownloadProgressed)]
        assert {e.node_id for e in progress} == {n.node_id for n in nodes}
        for node in nodes:
            last = [e for e in progress if e.node_id == node.node_id][-1]
            assert last.progress.bytes_done == last.progress.bytes_total > 0
            assert last.progress.files_done == last.progress.files_total
        # Loaded from partial folders, the ring answers token for token as one process does.
        chunks = await collect(cluster.node.coordinator.chat(REQUEST))
        assert isinstance(chunks[-1], DoneChunk), chunks
        assert chunks[-1].token_ids == expected.token_ids
        # The nodes now list the model with the layers they hold: nothing to fetch next time.
        await cluster.wait(lambda: not plan_fetches(placement, card, stats(cluster)), 5)
        held = {n.node_id: card_of(n).layers_on_disk for n in stats(cluster)}
        # (The first and last files also hold layers 0 and 3.)
        assert held == {
            node_id: tuple(sorted({0, 3, *range(start, end)}))
            for node_id, (start, end) in ranges.items()
        }
        await cluster.node.coordinator.stop()
        tasks.cancel_scope.cancel()


def one_has_one_lacks(
    start: StartNode, hub: HubServer, sharded: Path, tmp_path: Path
) -> tuple[NodeProcess, NodeProcess, Coordinating, ModelCard, threading.Event]:
    """A node with the model on disk and one without; the last file (the head, which every
    rank needs) waits at the hub until the returned event is set."""
    models = tmp_path / "models"
    shutil.copytree(sharded, models / REPO)
    has = start("has", "--models-dir", str(models), env=hub_env(hub, tmp_path / "has-hf"))
    lacks = start_fetcher(start, hub, tmp_path, "lacks")
    return has, lacks, Coordinating([has, lacks]), hub_card(sharded), hub.hold(SHARDS[3])


def loaded_all(cluster: Coordinating, node: NodeProcess) -> bool:
    """Whether `node` reported every layer of its share loaded."""
    return any(isinstance(e, LoadProgressed) and e.node_id == node.node_id
               and e.layers_loaded == e.total for e in cluster.events)  # fmt: skip


async def test_one_node_loads_while_the_other_downloads_its_share(
    start: StartNode, hub: HubServer, sharded: Path, tmp_path: Path
) -> None:
    has, lacks, cluster, card, release = one_has_one_lacks(start, hub, sharded, tmp_path)
    async with anyio.create_task_group() as tasks:
        placement = await cluster.start_and_place(tasks, card)
        fetches = plan_fetches(placement, card, stats(cluster))
        assert list(fetches) == [lacks.node_id]
        async with anyio.create_task_group() as launching:
            launching.start_soon(
                partial(cluster.node.coordinator.launch, placement, card, fetches=fetches)
            )
            # The node that has its files loads all its layers while the other still fetches.
            await cluster.wait(lambda: loaded_all(cluster, has), 30)
            assert not any(isinstance(e, LoadStarted) and e.node_id == lacks.node_id
                           for e in cluster.events)  # fmt: skip
            release.set()
        # The hub served only the fetching node's share, each file once.
        served = sorted(s.file for s in hub.served if s.file.endswith(".safetensors") and s.sent)
        assert served == sorted(files_for(*shares(placement)[lacks.node_id]))
        assert not snapshot_files(tmp_path, "has")
        chunks = await collect(cluster.node.coordinator.chat(REQUEST))
        assert isinstance(chunks[-1], DoneChunk), chunks
        await cluster.node.coordinator.stop()
        tasks.cancel_scope.cancel()


async def test_a_node_killed_while_its_ranks_wait_for_the_others_leaves_no_runner(
    start: StartNode, hub: HubServer, sharded: Path, tmp_path: Path
) -> None:
    has, lacks, cluster, card, release = one_has_one_lacks(start, hub, sharded, tmp_path)
    async with anyio.create_task_group() as tasks:
        placement = await cluster.start_and_place(tasks, card)
        fetches = plan_fetches(placement, card, stats(cluster))
        failure: list[ClusterError] = []
        waiting: list[psutil.Process] | None = None

        async def launch() -> None:
            try:
                await cluster.node.coordinator.launch(placement, card, fetches=fetches)
            except ClusterError as error:
                failure.append(error)

        async with anyio.create_task_group() as launching:
            launching.start_soon(launch)
            # Loaded, waiting for the word to join (not inside MLX's ring start-up).
            await cluster.wait(lambda: bool(runner_pids(has)) and loaded_all(cluster, has), 30)
            waiting = [psutil.Process(pid) for pid in runner_pids(has)]
            has.process.kill()
            await cluster.wait(lambda: bool(failure), 10)
            release.set()
        assert "node has" in str(failure[0])
        assert waiting is not None
        # Its runners notice their node is gone and exit; the other node stops its download.
        await cluster.wait(lambda: not any(p.is_running() for p in waiting), 10)
        await cluster.wait(lambda: not runner_pids(lacks), 10)
        tasks.cancel_scope.cancel()


async def test_a_failed_download_fails_the_launch_and_names_the_node(
    start: StartNode, hub: HubServer, sharded: Path, tmp_path: Path
) -> None:
    hub.repos[REPO].status = "gated"
    nodes = [start_fetcher(start, hub, tmp_path, name) for name in ("n0", "n1")]
    cluster = Coordinating(nodes)
    card = hub_card(sharded)
    async with anyio.create_task_group() as tasks:
        placement = await cluster.start_and_place(tasks, card)
        fetches = plan_fetches(placement, card, stats(cluster))
        with pytest.raises(ClusterError, match=r"node n[01] could not download .*gated") as error:
            await cluster.node.coordinator.launch(placement, card, fetches=fetches)
        assert "HF_TOKEN" in str(error.value) or "access" in str(error.value)
        assert cluster.node.coordinator.instance is None
        assert all(not runner_pids(n) for n in nodes)
        assert all(n.process.poll() is None for n in nodes)  # the nodes stay up
        tasks.cancel_scope.cancel()


async def test_a_hostile_hub_behind_a_shard_fetch_writes_nothing_outside_the_node_caches(
    start: StartNode, sharded: Path, tmp_path: Path
) -> None:
    """A peer asks each node for its share; the hub names the first shard's blob as a climb to
    a file outside the cache. The launch fails naming the node, the repo and the field; the
    file is untouched and the nodes stay up."""
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"mine")
    with HostileHub() as hub:
        hub.add_repo(REPO, sharded)
        storage = Path("hub") / f"models--{REPO.replace('/', '--')}"
        # Both caches sit at the same depth under tmp_path: one climb reaches the victim.
        climb = climb_to(victim, tmp_path / "n0-hf" / storage / "blobs")
        hub.lie_about(SHARDS[0], "lfs.sha256", climb)
        hub.lie_about(SHARDS[0], "blobId", None)
        nodes = [start_fetcher(start, hub, tmp_path, name) for name in ("n0", "n1")]
        # Each node writes in its cache and its home (EXO_TUI_HOME): nowhere else.
        theirs = [tmp_path / folder for folder in ("n0-hf", "n1-hf", "n0", "n1")]
        before = tree_outside(tmp_path, *theirs)
        cluster = Coordinating(nodes)
        card = hub_card(sharded)
        async with anyio.create_task_group() as tasks:
            placement = await cluster.start_and_place(tasks, card)
            fetches = plan_fetches(placement, card, stats(cluster))
            with pytest.raises(ClusterError, match=r"node n[01] could not download") as error:
                await cluster.node.coordinator.launch(placement, card, fetches=fetches)
            assert REPO in str(error.value) and "lfs.sha256" in str(error.value)
            assert all(n.process.poll() is None for n in nodes)  # the nodes stay up
            tasks.cancel_scope.cancel()
    assert victim.read_bytes() == b"mine"
    assert tree_outside(tmp_path, *theirs) == before


def test_a_model_that_is_not_a_hub_repo_cannot_be_fetched(tiny_llama: Path) -> None:
    card = read_card(tiny_llama)  # a local folder: nothing to download it from
    placement_card = card.model_copy(update={"name": "tiny-llama"})
    from exo_tui.cluster.control.placement import place

    nodes = [
        NodeStats(node_id=i, name=i, backend="cpu", blas="", memory_total_bytes=2**34,
                  memory_available_bytes=2**33, models=models, cards=cards)
        for i, models, cards in (("a", ("tiny-llama",), (placement_card,)), ("b", (), ()))
    ]  # fmt: skip
    placement = place(nodes, placement_card, "pipeline")
    assert isinstance(placement, Placement)
    with pytest.raises(ClusterError, match="node b has no model called tiny-llama"):
        plan_fetches(placement, placement_card, nodes)
    hub = placement_card.model_copy(update={"source": "hf_cache"})
    assert plan_fetches(placement, hub, nodes) == {"b": shares(placement)["b"]}


def stats(cluster: Coordinating) -> list[NodeStats]:
    return [n.stats for n in cluster.state.nodes]


def card_of(node: NodeStats) -> ModelCard:
    return next(c for c in node.cards if c.name == REPO)
