"""The node daemon: a control port, mDNS, and one keyed session with every peer.

Each node listens on its control port, advertises itself over mDNS and dials the peers it finds
there or is given by hand (`--peer host:port`). Every connection starts with the mutual HMAC
handshake of `wire.handshake`; a peer without the cluster key is refused and reported as foreign.
Over a session both sides send their stats every second; the stats double as heartbeats, so a
peer that is silent for `SILENCE_S` is lost (mDNS keeps a killed node's records far longer).

One session per peer: when both sides dial each other, both keep the connection dialed by the
smaller node id, so they agree without talking about it.

The daemon reports what it learns as `ClusterEvent`s (and foreign peers) through callbacks; the
TUI folds them into its `ClusterState`, `exo-tui node` logs them.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc

from exo_tui.cluster.control.coordinator import Coordinator
from exo_tui.cluster.control.state import ClusterEvent, NodeLost, NodeStats, StatsUpdated
from exo_tui.cluster.discovery import Advert, Discovery, PeerFound, PeerRemoved
from exo_tui.cluster.identity import ClusterKey, NodeIdentity
from exo_tui.cluster.listening import accept_loop
from exo_tui.cluster.listening.admission import Admission
from exo_tui.cluster.listening.file_limit import raise_file_limit
from exo_tui.cluster.wire.frames import (
    PROTOCOL_VERSION,
    Frame,
    Goodbye,
    HostCommand,
    InstanceReport,
    StatsFrame,
)
from exo_tui.cluster.wire.framing import FrameStream, ProtocolError
from exo_tui.cluster.wire.handshake import (
    HandshakeRefused,
    PeerInfo,
    handshake_client,
    handshake_server,
)
from exo_tui.cluster.worker.rank_host import LOCAL_SESSION, Commander, RankHost
from exo_tui.rate import RatePerKey
from exo_tui.untrusted import NAME_LIMIT, REASON_LIMIT, shown

log = logging.getLogger(__name__)

DEFAULT_PORT = 52525
DUPLICATE = "already connected"
STATS_INTERVAL_S = 1.0
SILENCE_S = 3.0
CONNECT_TIMEOUT_S = 3.0
REDIAL_S = (0.5, 1.0, 2.0, 4.0)
FAILURE_LOG_EVERY_S = 60.0  # one line per address about failed handshakes, no oftener


Handshake = Callable[[FrameStream, bytes, str, str, str], Awaitable[PeerInfo]]


@dataclass(frozen=True)
class Foreign:
    """A peer that answered but does not hold our cluster key (or speaks another version)."""

    address: str
    reason: str
    peer: PeerInfo | None = None

    @classmethod
    def of(cls, address: str, reason: str, peer: PeerInfo | None) -> Foreign:
        """A Foreign with every text escaped and capped: all of it came from the peer."""
        if peer is not None:
            peer = PeerInfo(
                node_id=shown(peer.node_id, NAME_LIMIT),
                name=shown(peer.name, NAME_LIMIT),
                fingerprint=shown(peer.fingerprint, NAME_LIMIT),
            )
        return cls(address=shown(address), reason=shown(reason, REASON_LIMIT), peer=peer)


@dataclass
class NodeOptions:
    port: int = DEFAULT_PORT
    bind: str = "0.0.0.0"
    peers: Sequence[str] = ()  # "host:port" named by hand
    mdns: bool = True
    interfaces: Sequence[str] | None = None  # addresses mDNS binds; None: every interface


def parse_peer(text: str) -> tuple[str, int]:
    """`host:port` (or `[v6]:port`) -> (host, port); ValueError naming the problem."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"peer {text!r} is not HOST:PORT (for example 192.168.1.20:{DEFAULT_PORT})"
        )
    return host, int(port)


@dataclass(frozen=True)
class ClusterSetup:
    """Who this node is, the key it proves, and how it reaches peers: all a Node needs to run."""

    identity: NodeIdentity
    key: ClusterKey
    options: NodeOptions = field(default_factory=NodeOptions)


@dataclass
class _Session:
    peer: PeerInfo
    dialer: str  # node id of the side that dialed
    frames: FrameStream
    remote_host: str  # the peer's address on this connection: where the ring reaches it
    local_host: str  # ours
    number: int  # which session this is, for the instances started over it
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)


class Node:
    """One node: serve, discover, dial, and keep one live session with every peer."""

    def __init__(
        self,
        identity: NodeIdentity,
        key: ClusterKey,
        stats: Callable[[], NodeStats],
        on_event: Callable[[ClusterEvent], None],
        options: NodeOptions | None = None,
        on_foreign: Callable[[Foreign], None] | None = None,
        models_dirs: Sequence[Path] | None = None,
        include_bundled: bool = True,
        on_store_changed: Callable[[], None] | None = None,
    ) -> None:
        """`on_store_changed` runs in a worker thread after a download lands in this node's
        store: the caller rescans its models, so its stats list them."""
        self.identity = identity
        self.key = key
        self.options = options or NodeOptions()
        self._stats = stats
        self._on_event = on_event
        self._on_foreign: Callable[[Foreign], None] = on_foreign or _ignore
        self._sessions: dict[str, _Session] = {}
        self._dialing: set[tuple[str, int]] = set()
        self._admission = Admission()
        self._failure_log = RatePerKey(FAILURE_LOG_EVERY_S)
        self._session_numbers = itertools.count(LOCAL_SESSION + 1)
        self.port = self.options.port
        self.models_dirs = models_dirs
        self.include_bundled = include_bundled
        self._on_store_changed = on_store_changed
        self.coordinator = Coordinator(self.send_to, self.address_of, on_event)
        self.host: RankHost | None = None

    @property
    def peers(self) -> tuple[PeerInfo, ...]:
        """The peers with a live session."""
        return tuple(s.peer for s in self._sessions.values())

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve until cancelled; `task_status.started(port)` once the control port listens."""
        raise_file_limit()
        listener = await anyio.create_tcp_listener(
            local_host=self.options.bind, local_port=self.options.port, reuse_port=False
        )
        self.port = int(listener.extra(anyio.abc.SocketAttribute.local_port))
        async with listener, anyio.create_task_group() as tasks:
            self.host = RankHost(
                self.identity.name,
                self.models_dirs,
                self.send_to,
                tasks,
                self.include_bundled,
                on_store_changed=self._on_store_changed,
            )
            self.coordinator.tasks = tasks
            tasks.start_soon(accept_loop.serve, listener, self._accept)
            for text in self.options.peers:
                tasks.start_soon(self._dial_forever, *parse_peer(text))
            if self.options.mdns:
                tasks.start_soon(self._discover, tasks)
            task_status.started(self.port)
            try:
                await anyio.sleep_forever()
            finally:
                with anyio.CancelScope(shield=True):
                    await self.host.stop_all()  # no runner outlives its node

    # ------------------------------------------------------------------ connections

    async def _accept(self, stream: anyio.abc.SocketStream) -> None:
        frames = FrameStream(stream)
        peer: PeerInfo | None = None
        with self._admission.place(_hosts(stream)[0]):  # a newer connection may displace it
            peer = await self._handshake(frames, handshake_server, _remote(stream))
        if peer is None:
            await anyio.aclose_forcefully(frames)
            return
        await self._session(frames, peer, peer.node_id, *_hosts(stream))

    async def _dial_forever(self, host: str, port: int) -> None:
        """Keep a session with the peer at host:port, redialing with a growing pause."""
        attempt = 0
        while True:
            if await self._dial(host, port):
                attempt = 0  # it worked, then ended: try again soon
            await anyio.sleep(REDIAL_S[min(attempt, len(REDIAL_S) - 1)])
            attempt += 1

    async def _dial(self, host: str, port: int) -> bool:
        """One connection to host:port, served until it ends; True when a session ran."""
        address = f"{host}:{port}"
        try:
            with anyio.fail_after(CONNECT_TIMEOUT_S):
                stream = await anyio.connect_tcp(host, port)
        except (OSError, TimeoutError) as error:
            log.debug("cannot reach %s: %s", address, error)
            return False
        frames = FrameStream(stream)
        peer = await self._handshake(frames, handshake_client, address)
        if peer is None:
            return False
        await self._session(frames, peer, self.identity.node_id, *_hosts(stream))
        return True

    async def _handshake(
        self, frames: FrameStream, handshake: Handshake, address: str
    ) -> PeerInfo | None:
        """Either side's handshake; None (connection closed) when it fails: a refused peer is
        reported as foreign, anything else is logged."""
        try:
            return await handshake(
                frames,
                self.key.secret,
                self.identity.node_id,
                self.identity.name,
                self.key.fingerprint,
            )
        except HandshakeRefused as refused:
            self._on_foreign(Foreign.of(address, refused.reason, refused.peer))
        except (ProtocolError, OSError, anyio.EndOfStream, anyio.IncompleteRead) as error:
            held = self._failure_log.allow(address.rsplit(":", 1)[0])
            if held is not None:  # a flood of bad connections is not a flood of log lines
                more = f" ({held} more from there since the last said)" if held else ""
                log.warning(
                    "handshake with %s failed: %s%s", address, shown(str(error), REASON_LIMIT), more
                )
        await frames.aclose()
        return None

    # ------------------------------------------------------------------ discovery

    async def _discover(self, tasks: anyio.abc.TaskGroup) -> None:
        advert = Advert(
            node_id=self.identity.node_id,
            name=self.identity.name,
            version=PROTOCOL_VERSION,
            port=self.port,
            fingerprint=self.key.fingerprint,
        )
        async with Discovery(advert, interfaces=self.options.interfaces) as discovery:
            async for event in discovery.events():
                match event:
                    case PeerFound(advert=found):
                        self._found(found, tasks)
                    case PeerRemoved():
                        pass  # liveness comes from the session, not from mDNS

    def _found(self, advert: Advert, tasks: anyio.abc.TaskGroup) -> None:
        if advert.fingerprint != self.key.fingerprint:
            reason = f"holds another cluster key (fingerprint {advert.fingerprint})"
            peer = PeerInfo(
                node_id=advert.node_id, name=advert.name, fingerprint=advert.fingerprint
            )
            self._on_foreign(Foreign.of(_first(advert), reason, peer))
            return
        # Both ends see each other; only the smaller id dials, so there is one connection.
        if advert.node_id <= self.identity.node_id or not advert.addresses:
            return
        target = (advert.addresses[0], advert.port)
        if target not in self._dialing:
            self._dialing.add(target)
            tasks.start_soon(self._dial_forever, *target)

    # ------------------------------------------------------------------ sessions

    async def _session(
        self, frames: FrameStream, peer: PeerInfo, dialer: str, remote: str, local: str
    ) -> None:
        session = _Session(peer, dialer, frames, remote, local, number=next(self._session_numbers))
        commander = Commander(node_id=peer.node_id, session=session.number)
        if not self._claim(session):
            await _close(frames, DUPLICATE)
            return
        reason: str | None = None  # None: not a loss (our shutdown, or a preferred session)
        ended = False
        try:
            with session.scope:
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self._send_stats, frames)
                    reason = await self._receive(frames, peer, commander)
                    ended = True
                    tasks.cancel_scope.cancel()
        finally:
            if self.host is not None:
                # Even a session replaced by a newer one from the same node id: instances belong
                # to a session, and a newer one may be someone else using that id.
                self.host.coordinator_lost(commander)
            if self._sessions.get(peer.node_id) is session:
                del self._sessions[peer.node_id]
                if reason is not None:
                    self._on_event(NodeLost(node_id=peer.node_id, reason=reason))
                    self.coordinator.node_lost(peer.node_id, peer.name, reason)
            await _close(frames, "" if ended else "node shutting down")

    def _claim(self, session: _Session) -> bool:
        """Make `session` the peer's one session unless the current one is preferred."""
        current = self._sessions.get(session.peer.node_id)
        if current is not None:
            if self._preferred(current) or not self._preferred(session):
                return False
            current.scope.cancel()
        self._sessions[session.peer.node_id] = session
        return True

    # ------------------------------------------------------------------ instances

    async def send_to(self, node_id: str, frame: Frame) -> None:
        """Send `frame` to a peer, or hand it to this node's own host or coordinator."""
        if node_id == self.identity.node_id:
            self._deliver(Commander(node_id=node_id, session=LOCAL_SESSION), frame)
            return
        session = self._sessions.get(node_id)
        if session is None:
            self.coordinator.node_lost(node_id, node_id, "is not connected")
            return
        try:
            await session.frames.send(frame)
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as error:
            log.warning("could not send to %s: %s", shown(session.peer.name, NAME_LIMIT), error)

    def _deliver(self, sender: Commander, frame: Frame) -> bool:
        """Hand an instance frame from `sender` to this node's host (commands) or coordinator
        (reports); False when it is not an instance frame."""
        if isinstance(frame, HostCommand):
            if self.host is not None:
                self.host.handle(sender, frame)
        elif isinstance(frame, InstanceReport):
            self.coordinator.feed(sender.node_id, frame)
        else:
            return False
        return True

    def address_of(self, node_id: str) -> str:
        """Where the other nodes reach `node_id`: its address on our session with it, or for
        this node, our own address on those sessions."""
        session = self._sessions.get(node_id)
        if session is not None:
            return session.remote_host
        local = [s.local_host for s in self._sessions.values()]
        return local[0] if local else "127.0.0.1"

    def _preferred(self, session: _Session) -> bool:
        """Whether `session` was dialed by the smaller of its two node ids."""
        return session.dialer == min(self.identity.node_id, session.peer.node_id)

    def stats(self) -> NodeStats:
        """This node's stats now, with the runners it hosts."""
        stats = self._stats()
        if self.host is not None:
            stats = stats.model_copy(update={"runners": self.host.runners()})
        return stats

    async def _send_stats(self, frames: FrameStream) -> None:
        """Stats every second until the connection breaks (the receiving side says why)."""
        while True:
            try:
                await frames.send(StatsFrame(stats=self.stats()))
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                return
            await anyio.sleep(STATS_INTERVAL_S)

    async def _receive(self, frames: FrameStream, peer: PeerInfo, sender: Commander) -> str | None:
        """Fold the peer's frames into events until it goes quiet or away; return why (None:
        the peer kept another session with us, so nothing was lost)."""
        while True:
            with anyio.move_on_after(SILENCE_S):
                try:
                    frame = await frames.receive()
                except ProtocolError as error:
                    log.warning("bad frame from %s: %s", shown(peer.name, NAME_LIMIT), error)
                    return f"sent a malformed frame ({error})"
                except ConnectionResetError:
                    return "reset the connection"
                except (anyio.EndOfStream, anyio.IncompleteRead, OSError):
                    return "closed the connection"
                if self._deliver(sender, frame):
                    continue
                match frame:
                    case StatsFrame(stats=stats) if stats.node_id == peer.node_id:
                        self._on_event(StatsUpdated(stats=stats, at=time.time()))
                    case Goodbye(reason=reason):
                        if reason == DUPLICATE:
                            return None
                        return f"left ({reason})" if reason else "left"
                    case _:
                        log.warning(
                            "unexpected %s frame from %s", frame.type, shown(peer.name, NAME_LIMIT)
                        )
                        return f"sent an unexpected {frame.type} frame"
                continue
            return f"sent nothing for {SILENCE_S:g} s"


def _ignore(foreign: Foreign) -> None:
    pass


async def _close(frames: FrameStream, reason: str) -> None:
    with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
        if reason:
            with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                await frames.send(Goodbye(reason=reason))
        await frames.aclose()


def _hosts(stream: anyio.abc.SocketStream) -> tuple[str, str]:
    """(remote, local) IP addresses of a connection."""
    try:
        remote = str(stream.extra(anyio.abc.SocketAttribute.remote_address)[0])
        local = str(stream.extra(anyio.abc.SocketAttribute.local_address)[0])
    except (anyio.TypedAttributeLookupError, IndexError, TypeError):
        return "127.0.0.1", "127.0.0.1"
    return remote, local


def _remote(stream: anyio.abc.SocketStream) -> str:
    try:
        host, port = stream.extra(anyio.abc.SocketAttribute.remote_address)[:2]
        return f"{host}:{port}"
    except (anyio.TypedAttributeLookupError, ValueError, TypeError):
        return "?"


def _first(advert: Advert) -> str:
    return f"{advert.addresses[0]}:{advert.port}" if advert.addresses else f"?:{advert.port}"


def machine_node(
    setup: ClusterSetup,
    models_dirs: Sequence[Path] | None,
    on_event: Callable[[ClusterEvent], None],
    on_foreign: Callable[[Foreign], None] | None = None,
) -> Node:
    """This machine as a node outside the TUI: its stats carry the models in its store,
    scanned again when a download for a peer lands."""
    from engine.models.finding import find_models
    from exo_tui.cluster.this_machine import local_node_stats

    cards = find_models(models_dirs)

    def rescan() -> None:
        cards[:] = find_models(models_dirs)

    return Node(
        setup.identity,
        setup.key,
        stats=lambda: local_node_stats(identity=setup.identity, cards=cards),
        on_event=on_event,
        options=setup.options,
        on_foreign=on_foreign,
        models_dirs=models_dirs,
        on_store_changed=rescan,
    )
