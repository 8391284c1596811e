"""An instance takes commands only from the session that launched it.

A coordinator (a Node in this process, as in the TUI) launches a model on a real `exo-tui node`
process. A second peer that holds the cluster key, a hand-written client over a real socket,
reads the instance id from that node's stats and sends every instance command for it: each is
refused by name, nothing runs for it, and the owner's instance goes on untouched. Nor can it
feed the coordinator reports about the instance: only the nodes of the placement speak for it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import anyio
import pytest

from engine.generate import generate
from engine.loading import load_model_sync
from engine.models.cards import read_card
from engine.types import DoneChunk, ShardSpec, TextChunk
from exo_tui.cluster.control.placement import Placement, place
from exo_tui.cluster.control.state import NodeStats
from exo_tui.cluster.identity import ClusterKey
from exo_tui.cluster.wire.frames import (
    CancelChat,
    ChatFinished,
    ChatFrame,
    ChunkFrame,
    CommandRefused,
    FetchShard,
    Frame,
    HostCommand,
    InstanceFailed,
    InstanceReport,
    JoinRing,
    LaunchRanks,
    ReservePorts,
    StatsFrame,
    StopInstance,
)
from exo_tui.cluster.wire.framing import FrameStream
from exo_tui.cluster.wire.handshake import handshake_client
from tests.cluster.node_process import KEY, NodeProcess, StartNode
from tests.cluster.test_coordinator import REQUEST, Coordinating, collect, runner_pids

pytestmark = pytest.mark.anyio


@pytest.fixture
def models(tiny_llama: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "store"
    shutil.copytree(tiny_llama, folder / "tiny-llama")
    return folder


def every_command(instance_id: str) -> list[HostCommand]:
    return [
        ChatFrame(instance_id=instance_id, request_id=7, request=REQUEST),
        CancelChat(instance_id=instance_id, request_id=0),
        JoinRing(instance_id=instance_id),
        ReservePorts(instance_id=instance_id, count=1),
        FetchShard(instance_id=instance_id, repo_id="org/model", total_layers=4),
        LaunchRanks(
            instance_id=instance_id,
            model="tiny-llama",
            specs=(ShardSpec(strategy="pipeline", start_layer=0, end_layer=4),),
            hosts=("127.0.0.1:1",),
        ),
        StopInstance(instance_id=instance_id),
    ]


INTRUDER = NodeStats(
    node_id="n-intruder", name="intruder", backend="cpu", blas="none",
    memory_total_bytes=1, memory_available_bytes=1,
)  # fmt: skip


async def intruder_session(port: int) -> FrameStream:
    key = ClusterKey(text=KEY)
    frames = FrameStream(await anyio.connect_tcp("127.0.0.1", port))
    await handshake_client(frames, key.secret, INTRUDER.node_id, INTRUDER.name, key.fingerprint)
    return frames


async def intrude(node: NodeProcess) -> tuple[str, list[Frame]]:
    """As a second key holder: find the node's instance in its stats, send every command for
    it, and return the instance id and what the node answered."""
    heard: list[Frame] = []
    async with await intruder_session(node.port) as frames:
        with anyio.fail_after(10):
            while True:
                frame = await frames.receive()
                if isinstance(frame, StatsFrame) and frame.stats.runners:
                    instance_id = frame.stats.runners[0].instance_id
                    break
        commands = every_command(instance_id)
        for command in commands:
            await frames.send(command)
        with anyio.move_on_after(10):  # a guard: the node answers every command at once
            while sum(f.type == "command_refused" for f in heard) < len(commands):
                try:
                    frame = await frames.receive()
                except (anyio.EndOfStream, anyio.IncompleteRead):
                    break  # the node hung up: what it said before is the answer
                if not isinstance(frame, StatsFrame):
                    heard.append(frame)
    return instance_id, heard


async def test_a_second_key_holder_cannot_chat_on_or_stop_anothers_instance(
    start: StartNode, models: Path
) -> None:
    node = start("n0", "--models-dir", str(models))
    cluster = Coordinating([node])
    card = read_card(models / "tiny-llama")
    expected = [c for c in generate(load_model_sync(models / "tiny-llama"), REQUEST)][-1]
    assert isinstance(expected, DoneChunk)
    async with anyio.create_task_group() as tasks:
        await tasks.start(cluster.node.run)
        await cluster.wait(lambda: len(cluster.state.online_nodes) == 1, 15)
        placement = place(tuple(n.stats for n in cluster.state.online_nodes), card, "pipeline")
        assert isinstance(placement, Placement)
        await cluster.node.coordinator.launch(placement, card)
        runners = runner_pids(node)
        assert runners

        instance_id, heard = await intrude(node)

        # Every command was refused by name, and nothing else came back: no chunk of an answer,
        # no ports, no stop.
        refused = [f for f in heard if isinstance(f, CommandRefused)]
        assert refused == heard, heard
        sent = [c.type for c in every_command(instance_id)]
        assert sorted(f.command for f in refused) == sorted(sent)
        for refusal in refused:
            reason = refusal.reason
            assert refusal.instance_id == instance_id
            assert instance_id in reason and "another coordinator launched it" in reason
            assert "launch an instance of your own" in reason
        # The owner's instance runs on, on the same runners, and answers as before.
        assert runner_pids(node) == runners
        done = (await collect(cluster.node.coordinator.chat(REQUEST)))[-1]
        assert isinstance(done, DoneChunk) and done.token_ids == expected.token_ids
        await cluster.node.coordinator.stop()
        await cluster.wait(lambda: not runner_pids(node), 10)
        tasks.cancel_scope.cancel()


async def test_a_peer_outside_the_placement_cannot_fail_or_answer_for_an_instance(
    start: StartNode, models: Path
) -> None:
    node = start("n0", "--models-dir", str(models))
    cluster = Coordinating([node])
    card = read_card(models / "tiny-llama")
    expected = [c for c in generate(load_model_sync(models / "tiny-llama"), REQUEST)][-1]
    assert isinstance(expected, DoneChunk)
    async with anyio.create_task_group() as tasks:
        await tasks.start(cluster.node.run)
        await cluster.wait(lambda: len(cluster.state.online_nodes) == 1, 15)
        placement = place(tuple(n.stats for n in cluster.state.online_nodes), card, "pipeline")
        assert isinstance(placement, Placement)
        await cluster.node.coordinator.launch(placement, card)
        instance = cluster.node.coordinator.instance
        assert instance is not None
        iid = instance.instance_id  # as the node's stats show it to every peer
        forged: list[InstanceReport] = [
            InstanceFailed(instance_id=iid, reason="the intruder says it failed"),
            ChunkFrame(instance_id=iid, request_id=1, chunk=TextChunk(text="forged answer")),
            ChatFinished(instance_id=iid, request_id=1),
        ]
        async with await intruder_session(cluster.node.port) as frames:
            for report in forged:
                await frames.send(report)
            # A session's frames are read in order: once its stats are in, so are the reports.
            await frames.send(StatsFrame(stats=INTRUDER))
            await cluster.wait(lambda: cluster.state.node(INTRUDER.node_id) is not None, 10)
            chunks = await collect(cluster.node.coordinator.chat(REQUEST))
        assert not any(isinstance(c, TextChunk) and "forged" in c.text for c in chunks)
        done = chunks[-1]
        assert isinstance(done, DoneChunk) and done.token_ids == expected.token_ids, chunks
        await cluster.node.coordinator.stop()
        await cluster.wait(lambda: not runner_pids(node), 10)
        tasks.cancel_scope.cancel()
