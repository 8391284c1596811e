"""A coordinator launches a model across real `exo-tui node` processes and chats with it.

The coordinator is a Node in the test process (like the TUI); the ranks run in runner processes
started by the nodes, joined in MLX's ring over 127.0.0.1. Greedy output must be token for token
what one process gives; faults must end every state.
"""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import anyio.abc
import psutil
import pytest

from engine.generate import generate
from engine.loading import load_model_sync
from engine.models.cards import read_card
from engine.types import ChatRequest, Chunk, DoneChunk, ErrorChunk, Message, ModelCard
from exo_tui.cluster.control.placement import Placement, place
from exo_tui.cluster.control.state import (
    ClusterEvent,
    ClusterState,
    InstancePlaced,
    LoadFinished,
    LoadProgressed,
    apply,
)
from exo_tui.cluster.errors import ClusterError
from exo_tui.cluster.identity import ClusterKey, NodeIdentity
from exo_tui.cluster.node import Node, NodeOptions
from exo_tui.cluster.this_machine import local_node_stats
from tests.cluster.node_process import KEY, NodeProcess, StartNode

pytestmark = pytest.mark.anyio

REQUEST = ChatRequest(
    messages=(Message(role="user", content="Tell me about the nodes of this cluster."),),
    max_tokens=40,
    temperature=0.0,
)


@pytest.fixture
def models(tiny_llama: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "store"
    shutil.copytree(tiny_llama, folder / "tiny-llama")
    return folder


class Coordinating:
    """A Node in this process that folds events into a ClusterState, as the app does."""

    def __init__(self, peers: list[NodeProcess]) -> None:
        self.state = ClusterState()
        self.events: list[ClusterEvent] = []
        self.node = Node(
            NodeIdentity(node_id="n-coordinator", name="coordinator"),
            ClusterKey(text=KEY),
            stats=lambda: local_node_stats(identity=self.node.identity),
            on_event=self.apply,
            options=NodeOptions(port=0, mdns=False, peers=tuple(p.address for p in peers)),
            models_dirs=[],
        )

    def apply(self, event: ClusterEvent) -> None:
        self.events.append(event)
        self.state = apply(self.state, event)

    async def start_and_place(self, tasks: anyio.abc.TaskGroup, card: ModelCard) -> Placement:
        """Run the node, wait for both peers, and place `card` over them (pipeline)."""
        await tasks.start(self.node.run)
        await self.wait(lambda: len(self.state.online_nodes) == 2, 15)
        placement = place(tuple(n.stats for n in self.state.online_nodes), card, "pipeline")
        assert isinstance(placement, Placement)
        return placement

    async def wait(self, predicate: Callable[[], bool], timeout: float) -> None:
        with anyio.fail_after(timeout):
            while not predicate():
                await anyio.sleep(0.05)


async def collect(chunks: AsyncIterator[Chunk]) -> list[Chunk]:
    return [chunk async for chunk in chunks]


def runner_pids(node: NodeProcess) -> list[int]:
    return [c.pid for c in psutil.Process(node.process.pid).children(recursive=True)]


async def launched(start: StartNode, models: Path, strategy: str, count: int = 2):  # type: ignore[no-untyped-def]
    nodes = [start(f"n{i}", "--models-dir", str(models)) for i in range(count)]
    cluster = Coordinating(nodes)
    card = read_card(models / "tiny-llama")
    return nodes, cluster, card


async def test_pipeline_over_two_nodes_is_token_identical_to_one_process(
    start: StartNode, models: Path
) -> None:
    nodes, cluster, card = await launched(start, models, "pipeline")
    expected = [c for c in generate(load_model_sync(models / "tiny-llama"), REQUEST)][-1]
    assert isinstance(expected, DoneChunk)
    async with anyio.create_task_group() as tasks:
        placement = await cluster.start_and_place(tasks, card)
        assert {s.node_id for s in placement.shards} == {n.node_id for n in nodes}
        await cluster.node.coordinator.launch(placement, card)
        # Every node's bar reached n/n of its layers.
        finished = [e for e in cluster.events if isinstance(e, LoadFinished)]
        assert sorted(e.total for e in finished) == sorted(
            s.spec.num_layers for s in placement.shards
        )
        progress = [e for e in cluster.events if isinstance(e, LoadProgressed)]
        assert {e.node_id for e in progress} == {n.node_id for n in nodes}
        chunks = await collect(cluster.node.coordinator.chat(REQUEST))
        done = chunks[-1]
        assert isinstance(done, DoneChunk), chunks
        assert done.token_ids == expected.token_ids
        # Each node reports the ranks it runs, and its models with their cards.
        await cluster.wait(
            lambda: all(
                [r.state for r in n.stats.runners] == ["ready"] for n in cluster.state.nodes
            ),
            5,
        )
        assert {c.name for n in cluster.state.nodes for c in n.stats.cards} == {
            "tiny-llama",
            "demo",
        }
        # A second turn on the same ring.
        again = await collect(cluster.node.coordinator.chat(REQUEST))
        assert isinstance(again[-1], DoneChunk) and again[-1].token_ids == expected.token_ids
        await cluster.node.coordinator.stop()
        await cluster.wait(lambda: not any(runner_pids(n) for n in nodes), 10)
        tasks.cancel_scope.cancel()


async def test_a_model_placed_on_one_other_node_alone_runs_there(
    start: StartNode, models: Path
) -> None:
    nodes, cluster, card = await launched(start, models, "pipeline", count=1)
    expected = [c for c in generate(load_model_sync(models / "tiny-llama"), REQUEST)][-1]
    assert isinstance(expected, DoneChunk)
    async with anyio.create_task_group() as tasks:
        await tasks.start(cluster.node.run)
        await cluster.wait(lambda: len(cluster.state.online_nodes) == 1, 15)
        placement = place(tuple(n.stats for n in cluster.state.online_nodes), card, "pipeline")
        assert isinstance(placement, Placement)
        assert placement.node_ids == (nodes[0].node_id,)  # a ring of one, on the other node
        await cluster.node.coordinator.launch(placement, card)
        done = (await collect(cluster.node.coordinator.chat(REQUEST)))[-1]
        assert isinstance(done, DoneChunk) and done.token_ids == expected.token_ids
        await cluster.node.coordinator.stop()
        await cluster.wait(lambda: not runner_pids(nodes[0]), 10)
        tasks.cancel_scope.cancel()


async def test_a_node_killed_mid_generation_fails_the_instance_and_stops_the_others(
    start: StartNode, models: Path
) -> None:
    nodes, cluster, card = await launched(start, models, "pipeline")
    async with anyio.create_task_group() as tasks:
        placement = await cluster.start_and_place(tasks, card)
        await cluster.node.coordinator.launch(placement, card)
        long = REQUEST.model_copy(update={"max_tokens": 100_000})
        chunks: list[Chunk] = []
        killed_at = 0.0
        failed_in: float | None = None

        async def chat() -> None:
            async for chunk in cluster.node.coordinator.chat(long):
                chunks.append(chunk)

        victim, survivor = nodes[1], nodes[0]
        async with anyio.create_task_group() as chatting:
            chatting.start_soon(chat)
            await cluster.wait(lambda: len(chunks) > 3, 30)
            killed_at = time.monotonic()
            victim.process.kill()
            await cluster.wait(lambda: any(isinstance(c, ErrorChunk) for c in chunks), 5)
            failed_in = time.monotonic() - killed_at
        assert failed_in is not None and failed_in < 5
        assert isinstance(chunks[-1], DoneChunk)
        await cluster.wait(lambda: not runner_pids(survivor), 10)
        assert time.monotonic() - killed_at < 10
        tasks.cancel_scope.cancel()


async def test_a_model_a_node_lacks_is_refused_before_loading(
    start: StartNode, models: Path, tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    has = start("has", "--models-dir", str(models))
    lacks = start("lacks", "--models-dir", str(empty))
    cluster = Coordinating([has, lacks])
    card = read_card(models / "tiny-llama")
    async with anyio.create_task_group() as tasks:
        placement = await cluster.start_and_place(tasks, card)
        with pytest.raises(ClusterError, match="no model called tiny-llama"):
            await cluster.node.coordinator.launch(placement, card)
        await cluster.wait(lambda: not runner_pids(has), 10)
        tasks.cancel_scope.cancel()


async def test_a_node_lost_while_idle_stops_the_other_ranks(start: StartNode, models: Path) -> None:
    nodes, cluster, card = await launched(start, models, "pipeline")
    async with anyio.create_task_group() as tasks:
        placement = await cluster.start_and_place(tasks, card)
        cluster.apply(InstancePlaced(placement=placement))  # as the app does before launching
        await cluster.node.coordinator.launch(placement, card)
        assert cluster.state.instance_status == "ready"
        survivor, victim = nodes
        assert runner_pids(survivor)
        killed_at = time.monotonic()
        victim.process.send_signal(signal.SIGSTOP)  # silent, not closed: found by heartbeats
        await cluster.wait(lambda: cluster.state.instance_status == "failed", 5)
        await cluster.wait(lambda: not runner_pids(survivor), 10)
        assert time.monotonic() - killed_at < 10
        assert cluster.node.coordinator.instance is None
        chunks = await collect(cluster.node.coordinator.chat(REQUEST))
        assert isinstance(chunks[0], ErrorChunk)
        tasks.cancel_scope.cancel()


async def test_a_runner_crash_fails_the_chat_and_stops_the_other_node(
    start: StartNode, models: Path
) -> None:
    nodes, cluster, card = await launched(start, models, "pipeline")
    async with anyio.create_task_group() as tasks:
        placement = await cluster.start_and_place(tasks, card)
        await cluster.node.coordinator.launch(placement, card)
        chunks: list[Chunk] = []

        async def chat() -> None:
            async for chunk in cluster.node.coordinator.chat(
                REQUEST.model_copy(update={"max_tokens": 100_000})
            ):
                chunks.append(chunk)

        crashed: float | None = None
        async with anyio.create_task_group() as chatting:
            chatting.start_soon(chat)
            await cluster.wait(lambda: len(chunks) > 3, 30)
            crashed = time.monotonic()
            for pid in runner_pids(nodes[1]):
                psutil.Process(pid).kill()
            await cluster.wait(lambda: any(isinstance(c, ErrorChunk) for c in chunks), 5)
        error = next(c for c in chunks if isinstance(c, ErrorChunk))
        assert "node n1" in error.message and "SIGKILL" in error.message
        await cluster.wait(lambda: not runner_pids(nodes[0]), 10)
        assert crashed is not None and time.monotonic() - crashed < 10
        assert all(n.process.poll() is None for n in nodes)  # the nodes themselves stay up
        tasks.cancel_scope.cancel()


def test_when_the_coordinator_quits_the_nodes_stop_their_ranks(
    start: StartNode, models: Path, tmp_path: Path
) -> None:
    import os
    import subprocess
    import sys

    nodes = [start(f"n{i}", "--models-dir", str(models)) for i in range(2)]
    env = {**os.environ, "EXO_TUI_HOME": str(tmp_path / "coordinator")}
    argv = [sys.executable, "-m", "exo_tui.cli", "chat", "--cluster", "--json", "--no-mdns",
            "--port", "0", "--key", KEY, "--models-dir", str(models), "--model", "tiny-llama",
            "--prompt", "go on and on", "--max-tokens", "100000", "--temperature", "0",
            "--no-tools", "--discover", "2"]  # fmt: skip
    argv += ["--nodes", ",".join(n.node_id for n in nodes)]
    for n in nodes:
        argv += ["--peer", n.address]
    coordinator = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert coordinator.stdout is not None
        for line in coordinator.stdout:
            if '"text"' in line:
                break
        assert all(runner_pids(n) for n in nodes)
        quit_at = time.monotonic()
        coordinator.kill()
        deadline = quit_at + 10
        while any(runner_pids(n) for n in nodes):
            assert time.monotonic() < deadline, "runners outlived their coordinator by 10 s"
            time.sleep(0.1)
    finally:
        coordinator.kill()
        coordinator.wait()


async def test_a_node_killed_mid_load_fails_the_launch_and_stops_the_other(
    start: StartNode, models: Path
) -> None:
    nodes, cluster, card = await launched(start, models, "pipeline")
    async with anyio.create_task_group() as tasks:
        placement = await cluster.start_and_place(tasks, card)
        cluster.apply(InstancePlaced(placement=placement))
        failure: list[BaseException] = []

        async def launch() -> None:
            try:
                await cluster.node.coordinator.launch(placement, card)
            except ClusterError as error:
                failure.append(error)

        survivor, victim = nodes
        killed: float | None = None
        async with anyio.create_task_group() as launching:
            launching.start_soon(launch)
            # Its runner is starting (imports, then the ring's join): the node is loading.
            await cluster.wait(lambda: bool(runner_pids(victim)), 15)
            assert cluster.state.instance_status == "loading"
            killed = time.monotonic()
            victim.process.kill()
            await cluster.wait(lambda: bool(failure), 5)
        assert cluster.state.instance_status == "failed"
        await cluster.wait(lambda: not runner_pids(survivor), 10)
        assert killed is not None and time.monotonic() - killed < 10
        tasks.cancel_scope.cancel()


# A peer may send any request the wire carries; each bad one must come back as an error naming
# what is wrong, and the instance must keep serving.
BAD_REQUESTS = [
    (REQUEST.model_copy(update={"max_tokens": -1}), "max_tokens is -1"),
    (REQUEST.model_copy(update={"temperature": -5.0}), "temperature is -5.0"),
    (REQUEST.model_copy(update={"top_p": 2.0}), "top_p is 2.0"),
    (REQUEST.model_copy(update={"seed": -1}), "seed is -1"),
    (REQUEST.model_copy(update={"messages": ()}), "has no messages"),
    (
        REQUEST.model_copy(
            update={"messages": (Message(role="user", content="word " * 780_000),)}
        ),  # 3.9 MB: under the frame limit, far over the model's context
        "holds at most 2048",
    ),
]


async def test_a_peers_bad_chat_requests_get_an_error_back(start: StartNode, models: Path) -> None:
    nodes, cluster, card = await launched(start, models, "pipeline")
    expected = [c for c in generate(load_model_sync(models / "tiny-llama"), REQUEST)][-1]
    assert isinstance(expected, DoneChunk)
    async with anyio.create_task_group() as tasks:
        placement = await cluster.start_and_place(tasks, card)
        await cluster.node.coordinator.launch(placement, card)
        for request, words in BAD_REQUESTS:
            with anyio.fail_after(120):  # a hang guard: the big prompt is tokenized twice
                chunks = await collect(cluster.node.coordinator.chat(request))
            errors = [c for c in chunks if isinstance(c, ErrorChunk)]
            assert len(errors) == 1 and words in errors[0].message, chunks
            done = chunks[-1]
            assert isinstance(done, DoneChunk) and done.finish_reason == "error"
        # Nothing failed but the requests: the same instance answers a good one as before.
        assert cluster.node.coordinator.instance is not None
        done = (await collect(cluster.node.coordinator.chat(REQUEST)))[-1]
        assert isinstance(done, DoneChunk) and done.token_ids == expected.token_ids
        assert all(n.process.poll() is None for n in nodes)
        tasks.cancel_scope.cancel()


async def test_a_peers_shard_spec_out_of_bounds_is_refused_naming_the_layers(
    start: StartNode, models: Path
) -> None:
    nodes, cluster, card = await launched(start, models, "pipeline", count=1)
    async with anyio.create_task_group() as tasks:
        await tasks.start(cluster.node.run)
        await cluster.wait(lambda: len(cluster.state.online_nodes) == 1, 15)
        placement = place(tuple(n.stats for n in cluster.state.online_nodes), card, "pipeline")
        assert isinstance(placement, Placement)
        # What a hostile peer can send: ShardSpec on the wire has no bounds of its own.
        placed = placement.shards[0]
        spec = placed.spec.model_copy(update={"start_layer": -3, "end_layer": 999})
        bad = placement.model_copy(update={"shards": (placed.model_copy(update={"spec": spec}),)})
        with pytest.raises(ClusterError) as refused:
            await cluster.node.coordinator.launch(bad, card)
        message = str(refused.value)
        assert "[-3, 999)" in message and "out of bounds" in message, message
        assert f"has {card.num_layers} layers" in message, message
        assert not runner_pids(nodes[0]) and nodes[0].process.poll() is None
        # The node serves the next launch as before.
        await cluster.node.coordinator.launch(placement, card)
        done = (await collect(cluster.node.coordinator.chat(REQUEST)))[-1]
        assert isinstance(done, DoneChunk) and done.finish_reason in ("stop", "length")
        tasks.cancel_scope.cancel()
