"""A node's side of an instance: the ranks a coordinator asked it to run, and their runners.

A coordinator may first ask the node to fetch its share of the model's files from the hub
(into the node's own cache), then reserves ring ports, then launches: the node loads the model
called by name from its own store (never a path a peer sent) as its ranks of the ring, in a
LocalRing whose blocking calls run in worker threads. Progress, rank 0's chunks and failures go
back to the coordinator.
An instance belongs to the session that started it: commands about it from any other session are
refused, and when that session ends its instances stop: no runner outlives the session that made
it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.from_thread
import anyio.to_thread

from engine.answer import failure_chunks
from engine.errors import EngineError
from engine.models.finding import find_models
from engine.types import Chunk, ModelCard
from exo_tui.cluster.control.state import HostedRunner
from exo_tui.cluster.errors import RingError
from exo_tui.cluster.wire.frames import (
    CancelChat,
    ChatFinished,
    ChatFrame,
    ChunkFrame,
    CommandRefused,
    FetchDone,
    FetchProgress,
    FetchShard,
    HostCommand,
    InstanceFailed,
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
from exo_tui.cluster.worker.local_ring import LocalRing, free_ports
from exo_tui.hub.downloads import download
from exo_tui.hub.errors import DownloadError

log = logging.getLogger(__name__)

FETCH_REPORT_S = 0.25  # at most this often a download's progress goes to the coordinator


@dataclass(frozen=True)
class Commander:
    """Who sent a command: the node to answer, and the session it came over (LOCAL: this node's
    own coordinator). A session, not a node id: a node id is only what a peer says it is."""

    node_id: str
    session: int


LOCAL_SESSION = 0  # sessions over the wire count from 1


@dataclass
class _Hosted:
    instance_id: str
    owner: Commander  # the session that started it: the only one it takes commands from
    ring: LocalRing | None = None
    fetching: threading.Event | None = None  # set: stop the download
    join: bool = False  # JoinRing came (perhaps before the ring was made)
    cancels: dict[int, threading.Event] = field(default_factory=lambda: {})
    stopped: bool = False

    def halt(self) -> None:
        """Mark it stopped and stop its download and chats; closing the ring is the caller's
        (it blocks for up to two seconds)."""
        self.stopped = True
        if self.fetching is not None:
            self.fetching.set()
        for cancel in self.cancels.values():
            cancel.set()


class RankHost:
    """Runs the ranks coordinators ask this node for, one LocalRing per instance."""

    def __init__(
        self,
        node_name: str,
        models_dirs: Sequence[Path] | None,
        send: SendFrame,
        tasks: anyio.abc.TaskGroup,
        include_bundled: bool = True,
        on_store_changed: Callable[[], None] | None = None,
    ) -> None:
        self.node_name = node_name
        self._on_store_changed = on_store_changed
        self.models_dirs = models_dirs
        self.include_bundled = include_bundled
        self._send = send
        self._tasks = tasks
        self._hosted: dict[str, _Hosted] = {}

    def runners(self) -> tuple[HostedRunner, ...]:
        """What this node runs for each instance, for its stats."""
        found: list[HostedRunner] = []
        for hosted in self._hosted.values():
            ring = hosted.ring
            if hosted.fetching is not None:
                state = "downloading"
            elif ring is None:
                state = "starting"
            elif ring.failure is not None:
                state = "failed"
            else:
                state = "ready" if ring.ready else "loading"
            ranks = tuple(spec.rank for spec in ring.specs) if ring is not None else ()
            found.append(HostedRunner(instance_id=hosted.instance_id, ranks=ranks, state=state))
        return tuple(found)

    def handle(self, sender: Commander, frame: HostCommand) -> None:
        """Act on a coordinator's command; long work runs in its own task. A command about an
        instance another session started is refused: only its owner may drive it."""
        hosted = self._hosted.get(frame.instance_id)
        if hosted is not None and hosted.owner != sender:
            self._tasks.start_soon(self._send, sender.node_id, self._refusal(hosted, frame))
            return
        match frame:
            case FetchShard(instance_id=iid):
                self._hosted.setdefault(iid, _Hosted(iid, sender))
                self._tasks.start_soon(self._guarded, sender, frame, self._fetch)
            case ReservePorts(instance_id=iid, count=count):
                self._hosted.setdefault(iid, _Hosted(iid, sender))
                ports = tuple(free_ports(count, host="0.0.0.0"))  # the ring binds all interfaces
                self._tasks.start_soon(
                    self._send, sender.node_id, PortsReserved(instance_id=iid, ports=ports)
                )
            case LaunchRanks(instance_id=iid):
                self._hosted.setdefault(iid, _Hosted(iid, sender))
                self._tasks.start_soon(self._guarded, sender, frame, self._launch)
            case JoinRing():
                if hosted is not None:
                    hosted.join = True
                    if hosted.ring is not None:
                        self._tasks.start_soon(anyio.to_thread.run_sync, hosted.ring.join)
            case ChatFrame():
                self._tasks.start_soon(self._guarded, sender, frame, self._chat)
            case CancelChat(request_id=rid):
                if hosted is not None and rid in hosted.cancels:
                    hosted.cancels[rid].set()
            case StopInstance(instance_id=iid):
                self._tasks.start_soon(self._stop, iid, True)

    def _refusal(self, hosted: _Hosted, frame: HostCommand) -> CommandRefused:
        return CommandRefused(
            instance_id=hosted.instance_id,
            command=frame.type,
            reason=(
                f"node {self.node_name} refuses {frame.type} for instance {hosted.instance_id}: "
                "another coordinator launched it, and an instance takes commands only from the "
                "session that launched it; launch an instance of your own"
            ),
        )

    def coordinator_lost(self, owner: Commander) -> None:
        """Stop every instance `owner` started: nobody is left to drive it."""
        for hosted in list(self._hosted.values()):
            if hosted.owner == owner:
                self._tasks.start_soon(self._stop, hosted.instance_id, False)

    async def stop_all(self) -> None:
        for instance_id in list(self._hosted):
            await self._stop(instance_id, False)

    def close_now(self) -> None:
        """Stop every runner this node hosts, blocking: for a process that is exiting, whose
        event loop may run no more tasks (the TUI's, when the app unmounts)."""
        hosted_now = list(self._hosted.values())
        self._hosted.clear()
        for hosted in hosted_now:
            hosted.halt()
            if hosted.ring is not None:
                hosted.ring.close()

    # ------------------------------------------------------------------ commands

    async def _guarded(
        self,
        owner: Commander,
        frame: FetchShard | LaunchRanks | ChatFrame,
        work: Callable[[Commander, Any], Coroutine[Any, Any, None]],
    ) -> None:
        """Run `work`; anything unexpected fails the instance instead of the node."""
        try:
            await work(owner, frame)
        except Exception as error:  # the node serves other peers and instances: it stays up
            log.exception("instance %s failed", frame.instance_id)
            hosted = self._hosted.get(frame.instance_id) or _Hosted(frame.instance_id, owner)
            reason = f"node {self.node_name}: {type(error).__name__}: {error}"
            with anyio.CancelScope(shield=True):
                await self._failed(hosted, reason)

    def _card(self, name: str) -> ModelCard | None:
        cards = find_models(self.models_dirs, include_bundled=self.include_bundled)
        return next((card for card in cards if card.name == name), None)

    async def _fetch(self, owner: Commander, frame: FetchShard) -> None:
        """Download this node's share of the model from the hub, reporting progress."""
        iid = frame.instance_id
        hosted = self._hosted.setdefault(iid, _Hosted(iid, owner))
        cancel = hosted.fetching = threading.Event()
        last_report = 0.0

        def fetch() -> None:
            nonlocal last_report
            downloading = download(
                frame.repo_id, layers=frame.layers, total_layers=frame.total_layers, cancel=cancel
            )
            for event in downloading:
                now = time.monotonic()
                if now - last_report < FETCH_REPORT_S and event.bytes_done < event.bytes_total:
                    continue
                last_report = now
                report = FetchProgress(instance_id=iid, progress=event)
                anyio.from_thread.run(self._send, owner.node_id, report)

        try:
            await anyio.to_thread.run_sync(fetch, abandon_on_cancel=True)
        except DownloadError as error:
            if not hosted.stopped:
                reason = f"node {self.node_name} could not download {frame.repo_id}: {error}"
                await self._failed(hosted, reason)
            return
        finally:
            hosted.fetching = None
        if self._on_store_changed is not None:
            await anyio.to_thread.run_sync(self._on_store_changed)
        if not hosted.stopped:
            await self._send(owner.node_id, FetchDone(instance_id=iid))

    async def _launch(self, owner: Commander, frame: LaunchRanks) -> None:
        iid = frame.instance_id
        hosted = self._hosted.setdefault(iid, _Hosted(iid, owner))
        card = await anyio.to_thread.run_sync(self._card, frame.model)
        if hosted.stopped:
            return  # stopped while the model was being found: start nothing
        if card is None:
            await self._failed(hosted, f"node {self.node_name} has no model called {frame.model}")
            return
        try:
            ring = LocalRing(
                card,
                frame.specs,
                hosts=frame.hosts,
                join_timeout=frame.join_timeout_s,
                wait_to_join=frame.wait_to_join,
            )
            if hosted.join:
                ring.join()  # the word came while the model was being found
        except (ValueError, EngineError) as error:
            await self._failed(hosted, f"node {self.node_name} cannot run those ranks: {error}")
            return
        hosted.ring = ring
        per_rank = {spec.rank: 0 for spec in frame.specs}
        total = sum(spec.num_layers for spec in frame.specs)

        def load() -> None:
            for progress in ring.load():
                per_rank[progress.rank] = progress.layers_loaded
                report = RanksProgress(
                    instance_id=iid, layers_loaded=sum(per_rank.values()), total=total
                )
                anyio.from_thread.run(self._send, owner.node_id, report)

        try:
            await anyio.to_thread.run_sync(load, abandon_on_cancel=True)
        except RingError as error:
            await self._failed(hosted, f"node {self.node_name}: {error}")
            return
        if hosted.stopped:
            # Stopped while loading: _stop closed the ring it saw; close it again in case the
            # stop came before the ring was set (closing twice is harmless).
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(ring.close)
            return
        await self._send(owner.node_id, RanksReady(instance_id=iid, total=total))

    async def _chat(self, owner: Commander, frame: ChatFrame) -> None:
        hosted = self._hosted.get(frame.instance_id)
        if hosted is None or hosted.ring is None or not hosted.ring.ready:
            reason = f"node {self.node_name} has no loaded instance {frame.instance_id}"
            await self._send(
                owner.node_id, InstanceFailed(instance_id=frame.instance_id, reason=reason)
            )
            return
        ring = hosted.ring
        cancel = hosted.cancels[frame.request_id] = threading.Event()
        speaks = any(spec.rank == 0 for spec in ring.specs)  # only rank 0 yields the answer

        def answer(chunk: Chunk) -> None:
            message = ChunkFrame(
                instance_id=hosted.instance_id, request_id=frame.request_id, chunk=chunk
            )
            anyio.from_thread.run(self._send, owner.node_id, message)

        def chat() -> None:
            try:
                for chunk in ring.chat(frame.request, cancel):
                    if speaks and ring.failure is None:
                        answer(chunk)
            except EngineError as error:  # a request error on every rank: the ring is fine
                log.warning("request %s failed: %s", frame.request_id, error)
                if speaks:  # the coordinator shows it, as one machine would
                    for chunk in failure_chunks(str(error), refused=True):
                        answer(chunk)

        try:
            await anyio.to_thread.run_sync(chat, abandon_on_cancel=True)
        finally:
            hosted.cancels.pop(frame.request_id, None)
        if ring.failure is not None:
            await self._failed(hosted, f"node {self.node_name}: {ring.failure}")
            return
        await self._send(
            owner.node_id, ChatFinished(instance_id=hosted.instance_id, request_id=frame.request_id)
        )

    async def _failed(self, hosted: _Hosted, reason: str) -> None:
        await self._stop(hosted.instance_id, False)
        await self._send(
            hosted.owner.node_id, InstanceFailed(instance_id=hosted.instance_id, reason=reason)
        )

    async def _stop(self, instance_id: str, answer: bool) -> None:
        hosted = self._hosted.pop(instance_id, None)
        if hosted is None:
            return
        hosted.halt()
        if hosted.ring is not None:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(hosted.ring.close)
        if answer:
            await self._send(hosted.owner.node_id, InstanceStopped(instance_id=instance_id))
