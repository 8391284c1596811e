"""The coordinator: turns a placement into a running MLX ring across nodes, and chats with it.

    await coordinator.launch(placement, card)       # ClusterEvents report each node's layers
    async for chunk in coordinator.chat(request, cancel):
        ...
    await coordinator.stop()

Launching has the nodes that lack their share of a hub model download it (each node fetches
only the files of its layers, into its own cache), reserves a ring port on every node of the
placement, writes the ring's host list (each node at the address the others reach it on), and
asks every node to start its ranks as soon as it has its files: a node loads the model from its
own store by name, a pipeline rank before the ring forms, so the nodes that have their share
load while the others download. Chats go to every rank (they run in lockstep); the answer comes
from the node of rank 0. When a node fails or is lost, the others are told to stop at once, so
no rank is left waiting on the ring.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from engine.answer import failure_chunks
from engine.generate import CancelToken
from engine.types import ChatRequest, Chunk, ModelCard
from exo_tui.cluster.control.placement import Placement
from exo_tui.cluster.control.state import (
    ClusterEvent,
    DownloadProgressed,
    LoadFailed,
    LoadFinished,
    LoadProgressed,
    LoadStarted,
    NodeStats,
    Unloaded,
)
from exo_tui.cluster.errors import LaunchError
from exo_tui.cluster.wire.frames import (
    CancelChat,
    ChatFinished,
    ChatFrame,
    ChunkFrame,
    FetchDone,
    FetchProgress,
    FetchShard,
    InstanceFailed,
    InstanceReport,
    InstanceStopped,
    JoinRing,
    LaunchRanks,
    PortsReserved,
    RanksProgress,
    RanksReady,
    ReservePorts,
    SendFrame,
    StopInstance,
)
from exo_tui.cluster.worker.failures import lost_a_peer

Address = Callable[[str], str]  # node id -> the address the ring reaches it on

RESERVE_TIMEOUT_S = 10.0
GATHER_S = 0.5  # how long a failure waits for the other nodes' reports
STOP_TIMEOUT_S = 10.0


Fetches = Mapping[str, tuple[int, int] | None]  # node id -> the layers to download (None: all)


def plan_fetches(placement: Placement, card: ModelCard, nodes: Sequence[NodeStats]) -> Fetches:
    """What each node of `placement` must download before the launch: the files of the layers
    its ranks hold (a pipeline node), or all of them (tensor), unless they are on its disk.

    Raises LaunchError when a node lacks a model that cannot be downloaded (not a hub repo).
    """
    by_id = {n.node_id: n for n in nodes}
    fetches: dict[str, tuple[int, int] | None] = {}
    for node_id in placement.node_ids:
        node = by_id.get(node_id)
        if node is None:
            continue  # gone: the launch fails on it with that reason
        specs = placement.specs_for(node_id)
        # A node holding several pipeline ranks fetches the span from its first to last layer.
        span = (
            (min(s.start_layer for s in specs), max(s.end_layer for s in specs))
            if placement.strategy == "pipeline"
            else None
        )
        held = next((c for c in node.cards if c.name == placement.model), None)
        if held is None and placement.model in node.models:
            continue  # listed without its card: the whole model
        if held is not None and (held.holds_layers(*span) if span else held.layers_on_disk is None):
            continue
        if card.source != "hf_cache":
            raise LaunchError(
                f"node {node.name} has no model called {placement.model} on disk",
                f"Copy the model folder into a models folder of {node.name}, or choose other nodes",
            )
        fetches[node_id] = span
    return fetches


@dataclass
class _Instance:
    instance_id: str
    placement: Placement
    card: ModelCard
    failed: str | None = None
    next_request: int = 0
    ranks_of: dict[str, list[int]] = field(default_factory=lambda: {})

    @property
    def node_ids(self) -> list[str]:
        return list(self.ranks_of)

    @property
    def speaker(self) -> str:
        """The node of rank 0, which sends the answer."""
        return next(n for n, ranks in self.ranks_of.items() if 0 in ranks)


@dataclass(frozen=True)
class _Launch:
    """What every node's launch command shares."""

    instance: _Instance
    hosts: tuple[str, ...]
    join_timeout_s: float
    wait_to_join: bool


class Coordinator:
    """Launches, chats with and stops one instance at a time, through the node's sessions."""

    def __init__(
        self, send: SendFrame, address: Address, on_event: Callable[[ClusterEvent], None]
    ) -> None:
        self._send = send
        self._address = address
        self._on_event = on_event
        self.instance: _Instance | None = None
        self.tasks: anyio.abc.TaskGroup | None = None  # set by the node while it runs
        inbox = anyio.create_memory_object_stream[tuple[str, InstanceReport]](math.inf)
        self._inbox_in: MemoryObjectSendStream[tuple[str, InstanceReport]] = inbox[0]
        self._inbox: MemoryObjectReceiveStream[tuple[str, InstanceReport]] = inbox[1]

    # ------------------------------------------------------------------ from the node

    def feed(self, node_id: str, frame: InstanceReport) -> None:
        """A frame from a node about an instance; consumers drop those of earlier instances."""
        self._inbox_in.send_nowait((node_id, frame))

    def node_lost(self, node_id: str, name: str, reason: str) -> None:
        """A node of the instance is gone: fail it, and stop the others now, busy or not, so no
        rank is left spinning on the ring."""
        instance = self.instance
        if instance is None or node_id not in instance.ranks_of:
            return
        failed = InstanceFailed(instance_id=instance.instance_id, reason=f"node {name} {reason}")
        self._inbox_in.send_nowait((node_id, failed))
        instance.failed = failed.reason
        self.instance = None  # dead: a launch or chat waiting on it reads the failure first
        if self.tasks is not None:
            self.tasks.start_soon(self._stop_nodes, instance, False, node_id)

    async def _next(self, instance: _Instance) -> tuple[str, InstanceReport]:
        """The next frame about `instance` from one of its nodes (frames about earlier ones, or
        from peers outside the placement, are dropped)."""
        while True:
            node_id, frame = await self._inbox.receive()
            if frame.instance_id == instance.instance_id and node_id in instance.ranks_of:
                return node_id, frame

    # ------------------------------------------------------------------ launch

    async def launch(
        self,
        placement: Placement,
        card: ModelCard,
        join_timeout_s: float = 60.0,
        fetches: Fetches | None = None,
    ) -> None:
        """Start the ring of `placement`; returns when every node is ready, raises LaunchError
        (every node stopped) when one fails or is lost.

        `fetches` (from plan_fetches) are the downloads some nodes make first, each reporting
        its progress; the other nodes start at once (a pipeline rank loads while its peers
        download), and every rank joins the ring once every node has its files."""
        if self.instance is not None:
            await self.stop()
        instance = _Instance(uuid.uuid4().hex[:12], placement, card)
        for shard in sorted(placement.shards, key=lambda s: s.spec.rank):
            instance.ranks_of.setdefault(shard.node_id, []).append(shard.spec.rank)
        self.instance = instance
        fetching = set(fetches or {})
        try:
            for node_id, layers in (fetches or {}).items():
                fetch = FetchShard(instance_id=instance.instance_id, repo_id=card.name,
                                   layers=layers, total_layers=card.num_layers)  # fmt: skip
                await self._send(node_id, fetch)
            hosts = await self._reserve(instance, fetching)
            # While some nodes download, the others load and wait to join the ring.
            launch = _Launch(instance, hosts, join_timeout_s, wait_to_join=bool(fetching))
            for node_id in instance.ranks_of:
                if node_id not in fetching:
                    await self._launch_node(launch, node_id)
            await self._until_ready(launch, fetching)
        except LaunchError:
            raise
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._fail(instance, "the launch was cancelled")
            raise

    async def _launch_node(self, launch: _Launch, node_id: str) -> None:
        """Ask `node_id` to start its ranks of the ring (it loads them from its own store)."""
        instance = launch.instance
        specs = instance.placement.specs_for(node_id)
        total = sum(s.num_layers for s in specs)
        self._on_event(LoadStarted(node_id=node_id, model=instance.card.name, total=total))
        frame = LaunchRanks(
            instance_id=instance.instance_id,
            model=instance.card.name,
            specs=specs,
            hosts=launch.hosts,
            join_timeout_s=launch.join_timeout_s,
            wait_to_join=launch.wait_to_join,
        )
        await self._send(node_id, frame)

    async def _join_all(self, launch: _Launch) -> None:
        """Every node has its files: the ranks waiting to join the ring may."""
        for node_id in launch.instance.ranks_of:
            await self._send(node_id, JoinRing(instance_id=launch.instance.instance_id))

    def _fetch_report(self, instance: _Instance, node_id: str, frame: InstanceReport) -> bool:
        """Fold a node's download report into events; True when it says the node is done."""
        if isinstance(frame, FetchProgress):
            self._on_event(
                DownloadProgressed(
                    node_id=node_id, model=instance.card.name, progress=frame.progress
                )
            )
        return isinstance(frame, FetchDone)

    async def _reserve(self, instance: _Instance, fetching: set[str]) -> tuple[str, ...]:
        for node_id, ranks in instance.ranks_of.items():
            await self._send(
                node_id, ReservePorts(instance_id=instance.instance_id, count=len(ranks))
            )
        ports: dict[str, tuple[int, ...]] = {}
        with anyio.move_on_after(RESERVE_TIMEOUT_S):
            while len(ports) < len(instance.ranks_of):
                node_id, frame = await self._next(instance)
                match frame:
                    case PortsReserved(ports=reserved):
                        ports[node_id] = reserved
                    case InstanceFailed(reason=reason):
                        await self._fail(instance, reason, node_id)
                    case _:
                        if self._fetch_report(instance, node_id, frame):
                            fetching.discard(node_id)
        missing = [n for n in instance.ranks_of if n not in ports]
        if missing:
            await self._fail(
                instance,
                f"no ring port from node {missing[0]} within {RESERVE_TIMEOUT_S:g} s",
                missing[0],
            )
        hosts: dict[int, str] = {}
        for node_id, ranks in instance.ranks_of.items():
            for rank, port in zip(ranks, ports[node_id], strict=True):
                hosts[rank] = f"{self._address(node_id)}:{port}"
        return tuple(hosts[rank] for rank in range(len(hosts)))

    async def _until_ready(self, launch: _Launch, fetching: set[str]) -> None:
        instance = launch.instance
        ready: set[str] = set()
        while len(ready) < len(instance.ranks_of):
            node_id, frame = await self._next(instance)
            match frame:
                case RanksProgress(layers_loaded=loaded, total=total):
                    self._on_event(
                        LoadProgressed(node_id=node_id, layers_loaded=loaded, total=total)
                    )
                case RanksReady(total=total):
                    ready.add(node_id)
                    self._on_event(
                        LoadProgressed(node_id=node_id, layers_loaded=total, total=total)
                    )
                    self._on_event(
                        LoadFinished(node_id=node_id, model=instance.card.name, total=total)
                    )
                case InstanceFailed(reason=reason):
                    await self._fail(instance, reason, node_id)
                case _:
                    if self._fetch_report(instance, node_id, frame) and node_id in fetching:
                        fetching.discard(node_id)
                        await self._launch_node(launch, node_id)
                        if not fetching:
                            await self._join_all(launch)

    # ------------------------------------------------------------------ chat

    async def chat(
        self, request: ChatRequest, cancel: CancelToken | None = None
    ) -> AsyncGenerator[Chunk]:
        """Rank 0's chunks; the last is a DoneChunk. A failure ends it with an ErrorChunk."""
        instance = self.instance
        if instance is None or instance.failed is not None:
            for chunk in failure_chunks("No model is running on the cluster"):
                yield chunk
            return
        instance.next_request += 1
        rid = instance.next_request
        for node_id in instance.node_ids:
            await self._send(
                node_id,
                ChatFrame(instance_id=instance.instance_id, request_id=rid, request=request),
            )
        finished: set[str] = set()
        cancelled = False
        while len(finished) < len(instance.ranks_of):
            if cancel is not None and cancel.is_set() and not cancelled:
                cancelled = True
                for node_id in instance.node_ids:
                    await self._send(
                        node_id, CancelChat(instance_id=instance.instance_id, request_id=rid)
                    )
            # Never yield inside a cancel scope: each step of this generator may run in
            # another task (a thread steps it with anyio.from_thread).
            item: tuple[str, InstanceReport] | None = None
            with anyio.move_on_after(0.1):
                item = await self._next(instance)
            if item is None:
                continue
            node_id, frame = item
            match frame:
                case ChunkFrame(request_id=r, chunk=chunk) if (
                    r == rid and node_id == instance.speaker
                ):
                    yield chunk
                case ChatFinished(request_id=r) if r == rid:
                    finished.add(node_id)
                case InstanceFailed(reason=reason):
                    try:
                        await self._fail(instance, reason, node_id)
                    except LaunchError as error:
                        for chunk in failure_chunks(str(error)):
                            yield chunk
                    return
                case _:
                    pass

    # ------------------------------------------------------------------ stop

    async def stop(self) -> None:
        """Stop every node's ranks and wait (a while) for them to say so."""
        instance = self.instance
        if instance is None:
            return
        self.instance = None
        await self._stop_nodes(instance, wait=True)

    async def _stop_nodes(self, instance: _Instance, wait: bool, skip: str | None = None) -> None:
        pending = {n for n in instance.node_ids if n != skip}
        for node_id in pending:
            await self._send(node_id, StopInstance(instance_id=instance.instance_id))
        if wait:
            with anyio.move_on_after(STOP_TIMEOUT_S):
                while pending:
                    node_id, frame = await self._next(instance)
                    if isinstance(frame, InstanceStopped):
                        pending.discard(node_id)
        for node_id in pending:  # a failed node keeps showing why
            self._on_event(Unloaded(node_id=node_id))

    async def _fail(self, instance: _Instance, reason: str, node_id: str | None = None) -> None:
        """Mark the instance failed, stop every other node, and raise LaunchError.

        The first report is often a node that only lost its ring peer; the one whose runner
        actually died reports a moment later. Gather the reports for a moment and put the
        cause first."""
        reports = [(node_id, reason)]
        with anyio.move_on_after(GATHER_S):
            while True:
                other, frame = await self._next(instance)
                if isinstance(frame, InstanceFailed):
                    reports.append((other, frame.reason))
        causes = [r for r in reports if not lost_a_peer(r[1])] or reports
        node_id, reason = causes[0]
        echoes = [r for _, r in reports if r != reason]
        if echoes:
            reason += "; then: " + "; ".join(echoes)
        instance.failed = reason
        if node_id is not None:
            self._on_event(LoadFailed(node_id=node_id, reason=reason))
        self.instance = None
        await self._stop_nodes(instance, wait=False, skip=node_id)
        raise LaunchError(reason, "Place the model again on the nodes that are left")
