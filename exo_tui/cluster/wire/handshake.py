"""The mutual-HMAC handshake that opens a control connection, and its errors.

Each side proves it holds the cluster key, without the key crossing the wire:

    client -> Hello(nonce_c)
    server -> Challenge(nonce_s, proof = HMAC-SHA256(key, "server|" + transcript))
    client -> Proof(HMAC-SHA256(key, "client|" + transcript))
    server -> Welcome

The transcript holds everything both openings said (version, node ids, names, fingerprints and
both nonces), so a recorded proof is worthless against a fresh nonce, and the two labels keep
one side's proof from being reflected back as the other's. A side that cannot go on (another
protocol version, a wrong key) sends Refused and raises HandshakeRefused; so does a side that is
sent Refused.

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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import NoReturn, TypeVar, cast

import anyio

from engine.types import Frozen
from exo_tui.cluster.wire.frames import (
    PROTOCOL_VERSION,
    Challenge,
    Frame,
    Hello,
    Proof,
    Refused,
    Welcome,
)
from exo_tui.cluster.wire.framing import (
    MAX_FRAME_BYTES,
    MAX_HANDSHAKE_FRAME_BYTES,
    FrameStream,
    ProtocolError,
    decode,
)
from exo_tui.cluster.wire.sealed import SealedChannel

FIX_KEY = (
    "give every node the same cluster key: `exo-tui key` prints this node's key; pass it to the "
    "others with `--key` or EXO_TUI_KEY"
)


class PeerInfo(Frozen):
    """Who is at the other end, as it said in its Hello or Challenge."""

    node_id: str
    name: str
    fingerprint: str


class HandshakeRefused(Exception):
    """The handshake ended without trust: refused by either side, or timed out.

    `peer` is what the other side said about itself, when it got that far.
    """

    def __init__(self, reason: str, peer: PeerInfo | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.peer = peer


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
            raise HandshakeRefused(f"refused by {who}: {frame.reason}", self.peer)
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
        raise HandshakeRefused(f"{peer.name} ({peer.node_id}) is foreign: {why}; {FIX_KEY}", peer)

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
