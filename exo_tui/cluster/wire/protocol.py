"""The control connection's wire protocol: length-prefixed JSON frames and a mutual-HMAC handshake.

A frame is a 4-byte big-endian payload length, then that many bytes of UTF-8 JSON holding one
`Frame`, a pydantic union discriminated on `type`. Decoding is strict (no extra fields, no type
coercion), and a frame over MAX_FRAME_BYTES is refused from its header, before its body is read.

Every connection opens with a handshake in which each side proves it holds the cluster key,
without the key crossing the wire:

    client -> Hello(nonce_c)
    server -> Challenge(nonce_s, proof = HMAC-SHA256(key, "server|" + transcript))
    client -> Proof(HMAC-SHA256(key, "client|" + transcript))
    server -> Welcome

The transcript holds everything both openings said (version, node ids, names, fingerprints and
both nonces), so a recorded proof is worthless against a fresh nonce, and the two labels keep
one side's proof from being reflected back as the other's. A side that cannot go on (another
protocol version, a wrong key) sends Refused and raises HandshakeRefused; so does a side that is
sent Refused. Hello and Challenge keep their shape in every version, so that any two versions can
at least tell each other which one they speak.

After Welcome both sides seal every frame (`sealed`): keys derived from the cluster key, both
nonces and the transcript encrypt and authenticate it, and per-direction counts refuse a frame
that was injected, dropped, replayed or reordered.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import secrets
import struct
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NoReturn, TypeVar, cast

import anyio
import anyio.abc
from pydantic import Field, FiniteFloat, TypeAdapter, ValidationError, field_validator

from engine.parallel import ShardSpec
from engine.types import ChatRequest, Chunk, Frozen
from exo_tui.cluster.control.state import NodeStats
from exo_tui.cluster.wire.sealed import SealBroken, SealedChannel
from exo_tui.hub.progress import DownloadProgress
from exo_tui.untrusted import shown

# 2: per-node downloads (FetchShard ...), partial models in cards; 3: sealed sessions;
# 4: download progress as one nested type (FetchProgress.progress)
PROTOCOL_VERSION = 4
MAX_FRAME_BYTES = 4 * 1024 * 1024
# Until the handshake ends, frames come from anyone: an opening with a long name is under 1 KiB.
MAX_HANDSHAKE_FRAME_BYTES = 8 * 1024
HEADER = struct.Struct(">I")  # payload length in bytes; the payload is UTF-8 JSON

Hex256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]  # 32 random bytes, or a SHA-256 HMAC

FIX_KEY = (
    "give every node the same cluster key: `exo-tui key` prints this node's key; pass it to the "
    "others with `--key` or EXO_TUI_KEY"
)

# ---------------------------------------------------------------------- handshake frames


class Hello(Frozen):
    """The client's opening: who it is, and a fresh nonce the server must prove the key over."""

    type: Literal["hello"] = "hello"
    version: int
    node_id: str = Field(min_length=1)
    name: str
    fingerprint: str
    nonce: Hex256


class Challenge(Frozen):
    """The server's answer: who it is, its own nonce, and its proof over both openings."""

    type: Literal["challenge"] = "challenge"
    version: int
    node_id: str = Field(min_length=1)
    name: str
    fingerprint: str
    nonce: Hex256
    proof: Hex256


class Proof(Frozen):
    type: Literal["proof"] = "proof"
    proof: Hex256


class Welcome(Frozen):
    """The server accepted the client's proof: session frames may follow."""

    type: Literal["welcome"] = "welcome"


class Refused(Frozen):
    type: Literal["refused"] = "refused"
    reason: str


# ---------------------------------------------------------------------- session frames


class Heartbeat(Frozen):
    type: Literal["heartbeat"] = "heartbeat"
    sent_at: FiniteFloat  # time.time() on the sender


class StatsFrame(Frozen):
    type: Literal["stats"] = "stats"
    stats: NodeStats


class Goodbye(Frozen):
    """The sender is closing the connection on purpose (shutting down, or a duplicate session)."""

    type: Literal["goodbye"] = "goodbye"
    reason: str = ""


# Instances: the coordinator (the node the user drives) asks the nodes of a placement for ring
# ports, launches their ranks, sends chats and stops them; nodes answer with progress, chunks
# (the node of rank 0) and failures. A node loads only models from its own store, by name.


class ReservePorts(Frozen):
    """Coordinator -> node: hold a free TCP port for each of `count` ranks of `instance_id`."""

    type: Literal["reserve_ports"] = "reserve_ports"
    instance_id: str = Field(min_length=1)
    count: int = Field(ge=1, le=64)


class PortsReserved(Frozen):
    type: Literal["ports_reserved"] = "ports_reserved"
    instance_id: str
    ports: tuple[int, ...]


class FetchShard(Frozen):
    """Coordinator -> node: download, from the hub into the node's own cache, the files of
    `repo_id` that layers `layers` need (None: every file), before the launch."""

    type: Literal["fetch_shard"] = "fetch_shard"
    instance_id: str = Field(min_length=1)
    # A hub repo id ("org/name"), never a path: the node fetches into its own store.
    repo_id: str = Field(pattern=r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$", max_length=200)
    layers: tuple[int, int] | None = None
    total_layers: int = Field(ge=1)

    @field_validator("repo_id")
    @classmethod
    def _no_parent_parts(cls, repo_id: str) -> str:
        if ".." in repo_id:
            raise ValueError("a repo id has no '..'")
        return repo_id


class FetchProgress(Frozen):
    """Node -> coordinator: bytes and files of the node's share that have landed."""

    type: Literal["fetch_progress"] = "fetch_progress"
    instance_id: str
    progress: DownloadProgress


class FetchDone(Frozen):
    type: Literal["fetch_done"] = "fetch_done"
    instance_id: str


class LaunchRanks(Frozen):
    """Coordinator -> node: join the ring `hosts` (one "host:port" per rank) as `specs`' ranks,
    loading the model called `model` from the node's own store."""

    type: Literal["launch_ranks"] = "launch_ranks"
    instance_id: str = Field(min_length=1)
    model: str = Field(min_length=1)
    specs: tuple[ShardSpec, ...] = Field(min_length=1)
    hosts: tuple[str, ...] = Field(min_length=1)
    join_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    # Load, then join the ring only on JoinRing: other nodes still download their share.
    wait_to_join: bool = False


class JoinRing(Frozen):
    """Coordinator -> node: every node has its files; the ranks told to wait may join."""

    type: Literal["join_ring"] = "join_ring"
    instance_id: str


class RanksProgress(Frozen):
    """Node -> coordinator: layers loaded so far by the node's ranks, of their total."""

    type: Literal["ranks_progress"] = "ranks_progress"
    instance_id: str
    layers_loaded: int = Field(ge=0)
    total: int = Field(ge=0)


class RanksReady(Frozen):
    type: Literal["ranks_ready"] = "ranks_ready"
    instance_id: str
    total: int = Field(ge=0)


class InstanceFailed(Frozen):
    """Either way: the instance cannot go on (the node's ranks are stopped), and why."""

    type: Literal["instance_failed"] = "instance_failed"
    instance_id: str
    reason: str = Field(min_length=1)


class ChatFrame(Frozen):
    type: Literal["chat"] = "chat"
    instance_id: str
    request_id: int = Field(ge=0)
    request: ChatRequest


class ChunkFrame(Frozen):
    """Node of rank 0 -> coordinator: one chunk of the answer."""

    type: Literal["chunk"] = "chunk"
    instance_id: str
    request_id: int
    chunk: Chunk


class ChatFinished(Frozen):
    """Node -> coordinator: every rank of this node is done with the request."""

    type: Literal["chat_finished"] = "chat_finished"
    instance_id: str
    request_id: int


class CancelChat(Frozen):
    type: Literal["cancel_chat"] = "cancel_chat"
    instance_id: str
    request_id: int


class StopInstance(Frozen):
    """Coordinator -> node: stop and unload the instance's ranks."""

    type: Literal["stop_instance"] = "stop_instance"
    instance_id: str


class InstanceStopped(Frozen):
    type: Literal["instance_stopped"] = "instance_stopped"
    instance_id: str


class CommandRefused(Frozen):
    """Node -> a coordinator: that command is not yours to give (another session launched the
    instance); the instance goes on untouched."""

    type: Literal["command_refused"] = "command_refused"
    instance_id: str
    command: str
    reason: str


# What a coordinator tells the nodes of an instance, and what they report back.
HostCommand = (
    FetchShard | ReservePorts | LaunchRanks | JoinRing | ChatFrame | CancelChat | StopInstance
)  # fmt: skip
InstanceReport = (
    FetchProgress | FetchDone | PortsReserved | RanksProgress | RanksReady | InstanceFailed
    | ChunkFrame | ChatFinished | InstanceStopped | CommandRefused
)  # fmt: skip
InstanceFrame = HostCommand | InstanceReport

# A new frame is a Frozen model with its own `type` literal, added to this union.
Frame = Annotated[
    Hello
    | Challenge
    | Proof
    | Welcome
    | Refused
    | Heartbeat
    | StatsFrame
    | Goodbye
    | InstanceFrame,
    Field(discriminator="type"),
]

_frames: TypeAdapter[Frame] = TypeAdapter(Frame)

# Sends a frame to the node with this id (the node's own, or over its session).
SendFrame = Callable[[str, Frame], Coroutine[Any, Any, None]]


class ProtocolError(Exception):
    """The peer sent something that is not a valid frame; the connection cannot go on."""


class PeerInfo(Frozen):
    """Who is at the other end, as it said in its Hello or Challenge."""

    node_id: str
    name: str
    fingerprint: str


class HandshakeRefused(Exception):
    """The handshake ended without trust: refused by either side, or timed out.

    `peer` is what the other side said about itself, when it got that far; `foreign` is true when
    the peer holds another cluster key (its proof failed, or its fingerprint differs from ours).
    """

    def __init__(self, reason: str, peer: PeerInfo | None = None, foreign: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.peer = peer
        self.foreign = foreign


# ---------------------------------------------------------------------- frames on the wire


def encode(frame: Frame) -> bytes:
    payload = frame.model_dump_json().encode()
    if len(payload) > MAX_FRAME_BYTES:
        raise ProtocolError(
            f"{frame.type} frame of {len(payload)} bytes is over the {MAX_FRAME_BYTES}-byte limit"
        )
    return HEADER.pack(len(payload)) + payload


def decode(payload: bytes) -> Frame:
    """One frame from its payload (the bytes after the header); ProtocolError if it is not one."""
    try:
        return _frames.validate_json(payload, strict=True)
    except ValidationError as error:
        raise ProtocolError(f"malformed frame: {_describe(error)}") from None


def _describe(error: ValidationError) -> str:
    """What was wrong and where, without echoing the peer's (possibly huge) input back."""
    problems: list[str] = []
    for problem in error.errors(include_url=False):
        where = ".".join(str(part) for part in problem["loc"])
        said = f"{where}: {problem['msg']}" if where else problem["msg"]
        problems.append(shown(said))  # field names and tags may be the peer's own text
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return "; ".join(problems[:3]) + more


class FrameStream(anyio.abc.AsyncResource):
    """Frames over a byte stream. Sends are serialised, so several tasks may send at once."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self._stream = stream
        self._buffer = bytearray()
        self._send_lock = anyio.Lock()
        self._closed = False
        self.max_frame_bytes = MAX_FRAME_BYTES  # the handshake lowers it while it runs
        self._channel: SealedChannel | None = None  # set once the handshake has made the keys

    def seal(self, channel: SealedChannel) -> None:
        """From now on, frames both ways are sealed by `channel` (the handshake's last step)."""
        self._channel = channel

    async def send(self, frame: Frame) -> None:
        data = encode(frame)
        async with self._send_lock:
            if self._channel is not None:
                # Sealed under the lock: counts must follow the order frames leave in.
                payload = data[HEADER.size :]
                header = HEADER.pack(SealedChannel.sealed_size(len(payload)))
                data = header + self._channel.seal(payload, header)
            await self._stream.send(data)

    async def receive(self) -> Frame:
        """The next frame. ProtocolError on garbage; anyio.EndOfStream when the peer closed
        between frames, anyio.IncompleteRead when it closed in the middle of one,
        ConnectionResetError when the connection was reset (a killed peer, a cut link)."""
        return decode(await self.receive_payload())

    async def receive_payload(self) -> bytes:
        """The next frame's payload, undecoded: its length is checked, nothing else."""
        header = await self._read_exactly(HEADER.size, between_frames=True)
        (length,) = HEADER.unpack(header)
        channel = self._channel
        limit = self.max_frame_bytes
        if channel is not None:
            limit = SealedChannel.sealed_size(limit)
        if length > limit:
            during = " during the handshake" if self.max_frame_bytes < MAX_FRAME_BYTES else ""
            raise ProtocolError(f"frame of {length} bytes is over the {limit}-byte limit{during}")
        body = await self._read_exactly(length)
        if channel is None:
            return body
        try:
            return channel.open(body, header)
        except SealBroken as error:
            raise ProtocolError(str(error)) from None

    async def _read_exactly(self, count: int, *, between_frames: bool = False) -> bytes:
        while len(self._buffer) < count:
            try:
                self._buffer += await self._stream.receive()
            except anyio.EndOfStream:
                if between_frames and not self._buffer:
                    raise
                raise anyio.IncompleteRead from None
            except anyio.BrokenResourceError as error:
                # anyio reports a reset as a broken resource; callers handle OSError already.
                raise ConnectionResetError("the connection was reset") from error
        data = bytes(self._buffer[:count])
        del self._buffer[:count]
        return data

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._stream.aclose()


# ---------------------------------------------------------------------- the handshake

_SERVER_LABEL = b"server|"
_CLIENT_LABEL = b"client|"

_Expected = TypeVar("_Expected", Hello, Challenge, Proof, Welcome)


async def handshake_client(
    frames: FrameStream,
    key: bytes,
    node_id: str,
    name: str,
    fingerprint: str,
    timeout_s: float = 5.0,
) -> PeerInfo:
    """Open a connection: prove the server holds `key`, then prove we do. Returns the server.

    Raises HandshakeRefused, ProtocolError, or anyio.EndOfStream / anyio.IncompleteRead when the
    server hangs up (ConnectionResetError when it resets); on any failure the connection is closed.
    """
    me = PeerInfo(node_id=node_id, name=name, fingerprint=fingerprint)
    side = _Side(frames, me, waiting_for="the server's challenge")

    async def run() -> PeerInfo:
        nonce = secrets.token_hex(32)
        hello = Hello(
            version=PROTOCOL_VERSION,
            node_id=node_id,
            name=name,
            fingerprint=fingerprint,
            nonce=nonce,
        )
        await side.send(hello)
        challenge = await side.receive(Challenge)
        server = PeerInfo(
            node_id=challenge.node_id, name=challenge.name, fingerprint=challenge.fingerprint
        )
        side.peer = server
        if challenge.version != PROTOCOL_VERSION:
            await side.refuse_version(challenge.version, server.name)
        transcript = _transcript(hello, server, challenge.nonce)
        if not _proves(key, _SERVER_LABEL, transcript, challenge.proof):
            await side.refuse_foreign(server)
        await side.send(Proof(proof=_prove(key, _CLIENT_LABEL, transcript)))
        side.waiting_for = f"{server.name}'s welcome"
        await side.receive(Welcome)
        frames.seal(
            SealedChannel.from_handshake(key, nonce, challenge.nonce, transcript, client=True)
        )
        return server

    return await side.run(run, timeout_s)


async def handshake_server(
    frames: FrameStream,
    key: bytes,
    node_id: str,
    name: str,
    fingerprint: str,
    timeout_s: float = 5.0,
) -> PeerInfo:
    """Answer a connection: prove we hold `key`, then check the client does. Returns the client.

    Raises HandshakeRefused, ProtocolError, or anyio.EndOfStream / anyio.IncompleteRead when the
    client hangs up (ConnectionResetError when it resets); on any failure the connection is closed.
    """
    me = PeerInfo(node_id=node_id, name=name, fingerprint=fingerprint)
    side = _Side(frames, me, waiting_for="a hello")

    async def run() -> PeerInfo:
        hello = await side.receive(Hello)
        client = PeerInfo(node_id=hello.node_id, name=hello.name, fingerprint=hello.fingerprint)
        side.peer = client
        if hello.version != PROTOCOL_VERSION:
            await side.refuse_version(hello.version, client.name)
        nonce = secrets.token_hex(32)
        transcript = _transcript(hello, me, nonce)
        proof = _prove(key, _SERVER_LABEL, transcript)
        challenge = Challenge(
            version=PROTOCOL_VERSION,
            node_id=node_id,
            name=name,
            fingerprint=fingerprint,
            nonce=nonce,
            proof=proof,
        )
        await side.send(challenge)
        side.waiting_for = f"{client.name}'s proof"
        answer = await side.receive(Proof)
        if not _proves(key, _CLIENT_LABEL, transcript, answer.proof):
            await side.refuse_foreign(client)
        await side.send(Welcome())
        frames.seal(SealedChannel.from_handshake(key, hello.nonce, nonce, transcript, client=False))
        return client

    return await side.run(run, timeout_s)


def _transcript(hello: Hello, server: PeerInfo, server_nonce: str) -> bytes:
    """Both openings, unambiguously: a JSON list cannot be re-split across its fields."""
    said = [
        *(hello.version, hello.node_id, hello.name, hello.fingerprint, hello.nonce),
        *(server.node_id, server.name, server.fingerprint, server_nonce),
    ]
    return json.dumps(said).encode()


def _prove(key: bytes, label: bytes, transcript: bytes) -> str:
    return hmac.new(key, label + transcript, hashlib.sha256).hexdigest()


def _proves(key: bytes, label: bytes, transcript: bytes, proof: str) -> bool:
    return hmac.compare_digest(_prove(key, label, transcript).encode(), proof.encode())


@dataclass
class _Side:
    """One side of a handshake in progress: whom it talks to and what it waits for, so that a
    refusal or a timeout can say so."""

    frames: FrameStream
    me: PeerInfo
    waiting_for: str
    peer: PeerInfo | None = None

    def __post_init__(self) -> None:
        self.frames.max_frame_bytes = MAX_HANDSHAKE_FRAME_BYTES

    async def run(self, steps: Callable[[], Awaitable[PeerInfo]], timeout_s: float) -> PeerInfo:
        try:
            with anyio.fail_after(timeout_s):
                peer = await steps()
            self.frames.max_frame_bytes = MAX_FRAME_BYTES  # session frames may be big
            return peer
        except TimeoutError:
            await anyio.aclose_forcefully(self.frames)
            raise HandshakeRefused(
                f"handshake timed out after {timeout_s:g} s waiting for {self.waiting_for}",
                self.peer,
            ) from None
        except BaseException:
            # A peer that has not proved the key never gets to send a session frame.
            await anyio.aclose_forcefully(self.frames)
            raise

    async def send(self, frame: Frame) -> None:
        try:
            await self.frames.send(frame)
        except anyio.BrokenResourceError as error:
            raise anyio.EndOfStream("the peer hung up during the handshake") from error

    async def receive(self, wanted: type[_Expected]) -> _Expected:
        payload = await self.frames.receive_payload()
        try:
            frame = decode(payload)
        except ProtocolError:
            if wanted in (Hello, Challenge) and (claimed := _claimed_version(payload)):
                await self.refuse_version(*claimed)
            raise
        if isinstance(frame, Refused):
            who = self.peer.name if self.peer else "the peer"
            foreign = self.peer is not None and self.peer.fingerprint != self.me.fingerprint
            raise HandshakeRefused(f"refused by {who}: {frame.reason}", self.peer, foreign)
        if not isinstance(frame, wanted):
            raise ProtocolError(f"{frame.type} frame during the handshake, where it has no place")
        return frame

    async def refuse_version(self, version: int, peer_name: str) -> NoReturn:
        reason = (
            f"protocol version mismatch: {peer_name} speaks version {version} and {self.me.name} "
            f"speaks version {PROTOCOL_VERSION}: run the same exo-tui version on every machine"
        )
        await self._send_refused(reason)
        raise HandshakeRefused(reason, self.peer)

    async def refuse_foreign(self, peer: PeerInfo) -> NoReturn:
        ours = self.me.fingerprint
        if peer.fingerprint != ours:
            why = f"its key fingerprint {peer.fingerprint} differs from ours, {ours}"
        else:
            why = f"it claims our key fingerprint {ours} but cannot prove it holds the key"
        await self._send_refused(
            f"wrong cluster key: {peer.name} could not prove it holds the key of {self.me.name} "
            f"(fingerprint {ours}); {FIX_KEY}"
        )
        raise HandshakeRefused(
            f"{peer.name} ({peer.node_id}) is foreign: {why}; {FIX_KEY}", peer, foreign=True
        )

    async def _send_refused(self, reason: str) -> None:
        # Best effort: a peer that already hung up is refused all the same.
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await self.frames.send(Refused(reason=reason))


def _claimed_version(payload: bytes) -> tuple[int, str] | None:
    """The version and name an opening frame from another protocol version claims, when it does
    not decode as ours: Hello and Challenge keep `type`, `version` and `name` in every version."""
    try:
        said: object = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    if not isinstance(said, dict):
        return None
    opening = cast(dict[str, object], said)
    version, name = opening.get("version"), opening.get("name")
    if opening.get("type") not in ("hello", "challenge") or type(version) is not int:
        return None
    if version == PROTOCOL_VERSION:
        return None  # our own version, plainly malformed
    return version, name if isinstance(name, str) else "the peer"
