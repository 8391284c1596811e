"""Both ends of a control connection for the wire tests: loopback pairs, a scripted peer, sample
frames and peers."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import cast

import anyio
import anyio.abc
from hypothesis import HealthCheck, settings

from exo_tui.cluster.control.state import NodeStats
from exo_tui.cluster.wire.frames import (
    PROTOCOL_VERSION,
    Challenge,
    FetchDone,
    FetchProgress,
    FetchShard,
    Frame,
    Goodbye,
    Hello,
    Proof,
    RanksProgress,
    Refused,
    ReservePorts,
    StatsFrame,
    Welcome,
)
from exo_tui.cluster.wire.framing import (
    HEADER,
    FrameStream,
    decode,
)
from exo_tui.cluster.wire.handshake import (
    PeerInfo,
)
from exo_tui.hub.progress import DownloadProgress

KEY = b"k" * 32


OTHER_KEY = b"o" * 32


NONCE = "ab" * 32


FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def fingerprint(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()[:16]


STUDIO = PeerInfo(node_id="node-studio", name="studio", fingerprint=fingerprint(KEY))


LAPTOP = PeerInfo(node_id="node-laptop", name="laptop", fingerprint=fingerprint(KEY))


STRANGER = PeerInfo(node_id="node-stranger", name="stranger", fingerprint=fingerprint(OTHER_KEY))


STATS = NodeStats(
    node_id="node-studio",
    name="studio",
    backend="cpu",
    blas="openblas",
    memory_total_bytes=64 * 2**30,
    memory_available_bytes=40 * 2**30,
    models=("qwen3-0.6b", "llama-3.2-1b"),
)


EVERY_FRAME: list[Frame] = [
    Hello(version=1, node_id="a", name="laptop", fingerprint="f1", nonce=NONCE),
    Challenge(version=1, node_id="b", name="studio", fingerprint="f1", nonce=NONCE, proof=NONCE),
    Proof(proof=NONCE),
    Welcome(),
    Refused(reason="wrong cluster key"),
    ReservePorts(instance_id="i1", count=2),
    RanksProgress(instance_id="i1", layers_loaded=3, total=28),
    StatsFrame(stats=STATS),
    Goodbye(),
    Goodbye(reason="shutting down: ünïcödé ✓"),
    FetchShard(
        instance_id="i1", repo_id="mlx-community/Qwen3-0.6B-4bit", layers=(0, 14), total_layers=28
    ),
    FetchProgress(
        instance_id="i1",
        progress=DownloadProgress(bytes_done=1, bytes_total=2, files_done=0, files_total=3),
    ),
    FetchDone(instance_id="i1"),
]


def as_args(me: PeerInfo) -> tuple[str, str, str]:
    """node_id, name, fingerprint: the handshakes' arguments after the key."""
    return me.node_id, me.name, me.fingerprint


def hello_from(me: PeerInfo, version: int = PROTOCOL_VERSION, nonce: str = NONCE) -> Hello:
    return Hello(
        version=version, node_id=me.node_id, name=me.name, fingerprint=me.fingerprint, nonce=nonce
    )


def frame_payload(data: bytes) -> bytes:
    return HEADER.pack(len(data)) + data


@asynccontextmanager
async def tcp_pair() -> AsyncIterator[tuple[anyio.abc.SocketStream, anyio.abc.SocketStream]]:
    """Both ends of one real loopback TCP connection: (client, server)."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    async with listener:
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        client = await anyio.connect_tcp("127.0.0.1", port)
        server = await cast(anyio.abc.SocketListener, listener.listeners[0]).accept()
        async with client, server:
            yield client, server


@asynccontextmanager
async def frame_pair() -> AsyncIterator[tuple[FrameStream, FrameStream]]:
    async with tcp_pair() as (client, server):
        yield FrameStream(client), FrameStream(server)


class ScriptedStream(anyio.abc.ByteStream):
    """A peer that sends fixed bytes in fixed-size pieces, then closes; it records what it hears."""

    def __init__(self, script: bytes, piece: int = 1 << 16) -> None:
        self.script = script
        self.piece = piece
        self.heard = bytearray()
        self.closed = False

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self.closed:
            raise anyio.ClosedResourceError
        if not self.script:
            raise anyio.EndOfStream
        chunk, self.script = self.script[: self.piece], self.script[self.piece :]
        await anyio.lowlevel.checkpoint()
        return chunk

    async def send(self, item: bytes) -> None:
        if self.closed:
            raise anyio.ClosedResourceError
        self.heard += item

    async def send_eof(self) -> None:
        pass

    async def aclose(self) -> None:
        self.closed = True


def frames_in(data: bytes) -> list[Frame]:
    frames: list[Frame] = []
    while data:
        (length,) = HEADER.unpack(data[: HEADER.size])
        frames.append(decode(data[HEADER.size : HEADER.size + length]))
        data = data[HEADER.size + length :]
    return frames
