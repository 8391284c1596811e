"""The control connection's frames and handshake, over real loopback sockets where it matters."""

from __future__ import annotations

import hashlib
import json
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager, suppress
from typing import Any, cast

import anyio
import anyio.abc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exo_tui.cluster.control.state import NodeStats
from exo_tui.cluster.wire.protocol import (
    HEADER,
    MAX_FRAME_BYTES,
    MAX_HANDSHAKE_FRAME_BYTES,
    PROTOCOL_VERSION,
    Challenge,
    FetchDone,
    FetchProgress,
    FetchShard,
    Frame,
    FrameStream,
    Goodbye,
    HandshakeRefused,
    Heartbeat,
    Hello,
    PeerInfo,
    Proof,
    ProtocolError,
    Refused,
    StatsFrame,
    Welcome,
    decode,
    encode,
    handshake_client,
    handshake_server,
)
from exo_tui.hub.progress import DownloadProgress

pytestmark = pytest.mark.anyio

KEY = b"k" * 32
OTHER_KEY = b"o" * 32
NONCE = "ab" * 32
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


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
    Heartbeat(sent_at=1_700_000_000.25),
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


# ---------------------------------------------------------------------- frames


@pytest.mark.parametrize("frame", EVERY_FRAME, ids=lambda frame: frame.type)
def test_every_frame_round_trips(frame: Frame) -> None:
    data = encode(frame)
    (length,) = HEADER.unpack(data[: HEADER.size])
    assert length == len(data) - HEADER.size
    assert decode(data[HEADER.size :]) == frame


async def test_every_frame_crosses_a_socket_in_order() -> None:
    async with frame_pair() as (client, server):
        for frame in EVERY_FRAME:
            await client.send(frame)
        assert [await server.receive() for _ in EVERY_FRAME] == EVERY_FRAME


async def test_frames_arrive_whole_from_one_byte_pieces() -> None:
    stream = FrameStream(ScriptedStream(b"".join(map(encode, EVERY_FRAME)), piece=1))
    assert [await stream.receive() for _ in EVERY_FRAME] == EVERY_FRAME
    with pytest.raises(anyio.EndOfStream):
        await stream.receive()


@FUZZ
@given(
    st.one_of(
        st.builds(Goodbye, reason=st.text()),
        st.builds(Refused, reason=st.text()),
        st.builds(Heartbeat, sent_at=st.floats(allow_nan=False, allow_infinity=False)),
    )
)
def test_text_and_numbers_round_trip(frame: Frame) -> None:
    assert decode(encode(frame)[HEADER.size :]) == frame


def test_a_frame_over_the_limit_cannot_be_encoded() -> None:
    with pytest.raises(ProtocolError, match="goodbye frame of .* over the 4194304-byte limit"):
        encode(Goodbye(reason="x" * MAX_FRAME_BYTES))


async def test_a_frame_of_exactly_the_limit_crosses() -> None:
    overhead = len(Goodbye(reason="").model_dump_json())
    biggest = Goodbye(reason="x" * (MAX_FRAME_BYTES - overhead))
    assert len(encode(biggest)) == HEADER.size + MAX_FRAME_BYTES
    async with frame_pair() as (client, server), anyio.create_task_group() as tasks:
        tasks.start_soon(client.send, biggest)
        assert await server.receive() == biggest


async def test_an_oversize_header_is_refused_before_the_body_is_read() -> None:
    async with tcp_pair() as (client, server):
        # Only the header is ever sent: waiting for the body would hang until the timeout.
        await client.send(HEADER.pack(MAX_FRAME_BYTES + 1))
        with anyio.fail_after(5), pytest.raises(ProtocolError, match="4194305 bytes is over"):
            await FrameStream(server).receive()


async def test_a_truncated_body_is_an_incomplete_read() -> None:
    async with tcp_pair() as (client, server):
        await client.send(encode(Heartbeat(sent_at=1.0))[:-3])
        await client.send_eof()
        with pytest.raises(anyio.IncompleteRead):
            await FrameStream(server).receive()


async def test_a_truncated_header_is_an_incomplete_read() -> None:
    with pytest.raises(anyio.IncompleteRead):
        await FrameStream(ScriptedStream(b"\x00\x00")).receive()


async def test_a_close_between_frames_is_the_end_of_the_stream() -> None:
    async with tcp_pair() as (client, server):
        frames = FrameStream(server)
        await client.send(encode(Welcome()))
        await client.send_eof()
        assert await frames.receive() == Welcome()
        with pytest.raises(anyio.EndOfStream):
            await frames.receive()


@pytest.mark.parametrize(
    "repo_id",
    [
        "/etc/passwd",
        "../x",
        "org/..",
        "org/name/../../x",
        "../models/x",
        "C:\\models\\x",
        "name",
        "",
    ],
)
def test_a_fetch_names_a_hub_repo_never_a_path(repo_id: str) -> None:
    frame = {"type": "fetch_shard", "instance_id": "i1", "repo_id": repo_id, "total_layers": 4}
    with pytest.raises(ProtocolError, match="repo_id"):
        decode(json.dumps(frame).encode())


async def test_a_reset_connection_is_a_connection_reset_error() -> None:
    """A killed peer or a cut link resets the socket: callers see an OSError they handle,
    not anyio's BrokenResourceError (which once escaped a node's session and killed it)."""
    async with tcp_pair() as (client, server):
        frames = FrameStream(server)
        await client.send(encode(Welcome()))
        raw = client.extra(anyio.abc.SocketAttribute.raw_socket)
        # SO_LINGER with a zero timeout: close() sends RST instead of FIN.
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await client.aclose()
        assert await frames.receive() == Welcome()
        with pytest.raises(ConnectionResetError):
            await frames.receive()


MALFORMED = {
    "empty": (b"", "EOF while parsing"),
    "not json": (b"hello there", "Invalid JSON"),
    "not utf-8": (b'{"type": "goodbye", "reason": "\xff"}', "Invalid JSON"),
    "trailing bytes": (b'{"type": "welcome"}{}', "trailing characters"),
    "not an object": (b'["welcome"]', "Input should be an object"),
    "no type": (b'{"reason": "x"}', "Unable to extract tag using discriminator 'type'"),
    "unknown type": (b'{"type": "launch"}', "Input tag 'launch' found using 'type'"),
    "missing field": (b'{"type": "heartbeat"}', "heartbeat.sent_at: Field required"),
    "extra field": (b'{"type": "welcome", "admin": true}', "welcome.admin: Extra inputs"),
    "string for a number": (
        b'{"type": "heartbeat", "sent_at": "1.5"}',
        "heartbeat.sent_at: Input should be a valid number",
    ),
    "bool for an int": (
        json.dumps({**hello_from(LAPTOP).model_dump(), "version": True}).encode(),
        "hello.version: Input should be a valid integer",
    ),
    "non-finite float": (b'{"type": "heartbeat", "sent_at": NaN}', "finite number"),
    "nonce not hex": (
        json.dumps({**hello_from(LAPTOP).model_dump(), "nonce": "zz" * 32}).encode(),
        "hello.nonce: String should match pattern",
    ),
    "wrong type inside stats": (
        json.dumps(
            {"type": "stats", "stats": {**STATS.model_dump(), "memory_total_bytes": "lots"}}
        ).encode(),
        "stats.stats.memory_total_bytes: Input should be a valid integer",
    ),
    "deep nesting": (b"[" * 10_000, "recursion limit"),
}


@pytest.mark.parametrize(("payload", "says"), MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_payloads_are_protocol_errors_that_say_why(payload: bytes, says: str) -> None:
    with pytest.raises(ProtocolError, match="malformed frame") as raised:
        decode(payload)
    assert says in str(raised.value)


async def test_a_malformed_frame_on_the_wire_is_a_protocol_error() -> None:
    async with tcp_pair() as (client, server):
        await client.send(frame_payload(b'{"type": "launch"}'))
        with pytest.raises(ProtocolError, match="launch"):
            await FrameStream(server).receive()


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes_only_ever_decode_or_raise_protocol_error(payload: bytes) -> None:
    with suppress(ProtocolError):
        decode(payload)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
TAGS = st.sampled_from(["hello", "challenge", "proof", "welcome", "refused", "heartbeat", "stats"])


@FUZZ
@given(TAGS, st.dictionaries(st.sampled_from(["version", "nonce", "stats", "x"]), JSON_VALUES))
def test_random_json_objects_only_ever_decode_or_raise_protocol_error(
    tag: str, fields: dict[str, object]
) -> None:
    try:
        frame = decode(json.dumps({"type": tag, **fields}).encode())
    except ProtocolError:
        return
    assert frame.type == tag


# ---------------------------------------------------------------------- handshake


async def run_handshake(
    client_key: bytes = KEY,
    server_key: bytes = KEY,
    client: PeerInfo = LAPTOP,
    server: PeerInfo = STUDIO,
) -> tuple[PeerInfo | BaseException, PeerInfo | BaseException, FrameStream, FrameStream]:
    """Both sides over real TCP; each side's PeerInfo or the exception it raised."""
    results: dict[str, PeerInfo | BaseException] = {}

    async def side(name: str, run: Callable[[], Awaitable[PeerInfo]]) -> None:
        try:
            results[name] = await run()
        except Exception as error:
            results[name] = error

    async with tcp_pair() as (client_stream, server_stream):
        client_frames, server_frames = FrameStream(client_stream), FrameStream(server_stream)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(
                side,
                "server",
                lambda: handshake_server(server_frames, server_key, *as_args(server)),
            )
            tasks.start_soon(
                side,
                "client",
                lambda: handshake_client(client_frames, client_key, *as_args(client)),
            )
        return results["client"], results["server"], client_frames, server_frames


async def test_a_handshake_gives_each_side_the_other_and_opens_a_session() -> None:
    async with tcp_pair() as (client_stream, server_stream):
        client, server = FrameStream(client_stream), FrameStream(server_stream)
        found: dict[str, PeerInfo] = {}
        async with anyio.create_task_group() as tasks:

            async def serve() -> None:
                found["by server"] = await handshake_server(server, KEY, *as_args(STUDIO))

            tasks.start_soon(serve)
            found["by client"] = await handshake_client(client, KEY, *as_args(LAPTOP))
        assert found == {"by client": STUDIO, "by server": LAPTOP}
        await client.send(Heartbeat(sent_at=2.0))
        await server.send(StatsFrame(stats=STATS))
        assert await server.receive() == Heartbeat(sent_at=2.0)
        assert await client.receive() == StatsFrame(stats=STATS)


async def test_a_big_opening_is_refused_from_its_header_before_its_body_is_read() -> None:
    async with tcp_pair() as (client, server):
        # Only the header of a 4 MiB Hello is sent: waiting for its body would time out.
        await client.send(HEADER.pack(4 * 1024 * 1024 - 16))
        with anyio.fail_after(5), pytest.raises(ProtocolError, match="during the handshake"):
            await handshake_server(FrameStream(server), KEY, *as_args(STUDIO))


async def test_an_opening_with_a_long_name_fits_and_session_frames_may_be_big_again() -> None:
    long_named = PeerInfo(node_id="n-" + "9" * 62, name="n" * 255, fingerprint=fingerprint(KEY))
    opening = Hello(version=PROTOCOL_VERSION, nonce=NONCE, **long_named.model_dump())
    assert len(encode(opening)) < MAX_HANDSHAKE_FRAME_BYTES // 4
    async with tcp_pair() as (client_stream, server_stream):
        client, server = FrameStream(client_stream), FrameStream(server_stream)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(lambda: handshake_server(server, KEY, *as_args(STUDIO)))
            await handshake_client(client, KEY, *as_args(long_named))
        big = Goodbye(reason="x" * (MAX_HANDSHAKE_FRAME_BYTES * 16))
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(client.send, big)
            assert await server.receive() == big


async def test_a_wrong_key_is_refused_on_both_sides_as_foreign() -> None:
    client, server, client_frames, server_frames = await run_handshake(
        client_key=OTHER_KEY, client=STRANGER
    )
    # The client checks the server's proof first, finds the server foreign and says so.
    assert isinstance(client, HandshakeRefused)
    assert client.foreign and client.peer == STUDIO
    assert f"its key fingerprint {STUDIO.fingerprint} differs from ours" in client.reason
    assert "`exo-tui key`" in client.reason and "--key" in client.reason
    assert "EXO_TUI_KEY" in client.reason
    assert isinstance(server, HandshakeRefused)
    assert server.foreign and server.peer == STRANGER
    assert server.reason.startswith("refused by stranger: wrong cluster key")
    # Both connections are closed: no session frame can follow.
    for frames in (client_frames, server_frames):
        with pytest.raises(anyio.ClosedResourceError):
            await frames.receive()


async def test_an_impostor_claiming_our_fingerprint_is_refused_by_its_proof() -> None:
    impostor = PeerInfo(node_id="node-x", name="impostor", fingerprint=STUDIO.fingerprint)
    client, server, _, _ = await run_handshake(client_key=OTHER_KEY, client=impostor)
    assert isinstance(client, HandshakeRefused) and client.foreign
    assert isinstance(server, HandshakeRefused) and server.peer == impostor
    # It lied about its fingerprint, so the server cannot tell from that alone.
    assert not server.foreign


async def handshake_against(
    script: Callable[[FrameStream], Coroutine[Any, Any, None]],
    handshake: Callable[..., Awaitable[PeerInfo]],
    me: PeerInfo,
    timeout_s: float = 5.0,
) -> BaseException | PeerInfo:
    """`handshake` on one end of a TCP connection, a hand-written peer on the other."""
    outcome: BaseException | PeerInfo | None = None
    async with tcp_pair() as (ours, theirs), anyio.create_task_group() as tasks:
        tasks.start_soon(script, FrameStream(theirs))
        try:
            outcome = await handshake(FrameStream(ours), KEY, *as_args(me), timeout_s)
        except Exception as error:
            outcome = error
    assert outcome is not None
    return outcome


async def test_a_client_without_the_key_gets_no_session() -> None:
    heard: list[Frame | str] = []

    async def stranger(frames: FrameStream) -> None:
        await frames.send(hello_from(STRANGER))
        heard.append(await frames.receive())
        await frames.send(Proof(proof="0" * 64))
        heard.append(await frames.receive())
        try:
            await frames.send(StatsFrame(stats=STATS))  # pushing on regardless
            heard.append(await frames.receive())
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            heard.append("closed")

    outcome = await handshake_against(stranger, handshake_server, STUDIO)
    assert isinstance(outcome, HandshakeRefused) and outcome.foreign
    assert outcome.reason.startswith("stranger (node-stranger) is foreign: its key fingerprint")
    assert isinstance(heard[0], Challenge)
    assert isinstance(heard[1], Refused) and heard[1].reason.startswith("wrong cluster key")
    assert heard[2] == "closed"


async def test_a_newer_client_is_told_which_versions_meet() -> None:
    heard: list[Frame] = []

    async def newer(frames: FrameStream) -> None:
        await frames.send(hello_from(LAPTOP, version=PROTOCOL_VERSION + 1))
        heard.append(await frames.receive())

    outcome = await handshake_against(newer, handshake_server, STUDIO)
    expected = (
        f"protocol version mismatch: laptop speaks version {PROTOCOL_VERSION + 1} and studio "
        f"speaks version {PROTOCOL_VERSION}: run the same exo-tui version on every machine"
    )
    assert isinstance(outcome, HandshakeRefused) and not outcome.foreign
    assert outcome.reason == expected
    assert heard == [Refused(reason=expected)]


async def test_a_version_mismatch_is_clear_on_the_client_too() -> None:
    async def older_server(frames: FrameStream) -> None:
        hello = await frames.receive()
        assert isinstance(hello, Hello)
        await frames.send(Refused(reason="protocol version mismatch: laptop speaks version 1"))

    outcome = await handshake_against(older_server, handshake_client, LAPTOP)
    assert isinstance(outcome, HandshakeRefused)
    assert (
        outcome.reason == "refused by the peer: protocol version mismatch: laptop speaks version 1"
    )


async def test_a_future_hello_of_another_shape_still_gets_a_version_answer() -> None:
    heard: list[Frame] = []

    async def future(frames: FrameStream) -> None:
        opening = {"type": "hello", "version": 7, "name": "laptop", "features": ["moe"]}
        await frames._stream.send(frame_payload(json.dumps(opening).encode()))
        heard.append(await frames.receive())

    outcome = await handshake_against(future, handshake_server, STUDIO)
    assert isinstance(outcome, HandshakeRefused)
    assert f"laptop speaks version 7 and studio speaks version {PROTOCOL_VERSION}" in outcome.reason
    assert isinstance(heard[0], Refused) and heard[0].reason == outcome.reason


async def test_a_server_of_another_version_is_refused_by_the_client() -> None:
    heard: list[Frame] = []

    async def newer_server(frames: FrameStream) -> None:
        await frames.receive()
        challenge = Challenge(
            version=PROTOCOL_VERSION + 1, nonce=NONCE, proof=NONCE, **STUDIO.model_dump()
        )
        await frames.send(challenge)
        heard.append(await frames.receive())

    outcome = await handshake_against(newer_server, handshake_client, LAPTOP)
    assert isinstance(outcome, HandshakeRefused) and outcome.peer == STUDIO
    assert (
        f"studio speaks version {PROTOCOL_VERSION + 1} and laptop speaks version "
        f"{PROTOCOL_VERSION}" in outcome.reason
    )
    assert heard == [Refused(reason=outcome.reason)]


@pytest.mark.parametrize(
    ("handshake", "me", "waiting_for"),
    [(handshake_server, STUDIO, "a hello"), (handshake_client, LAPTOP, "the server's challenge")],
    ids=["server", "client"],
)
async def test_a_silent_peer_times_out(
    handshake: Callable[..., Awaitable[PeerInfo]], me: PeerInfo, waiting_for: str
) -> None:
    async def silent(frames: FrameStream) -> None:
        await anyio.sleep(0.5)

    with anyio.fail_after(5):
        outcome = await handshake_against(silent, handshake, me, timeout_s=0.2)
    assert isinstance(outcome, HandshakeRefused)
    assert outcome.reason == f"handshake timed out after 0.2 s waiting for {waiting_for}"


async def test_a_peer_that_stalls_midway_times_out_by_name() -> None:
    async def stalls(frames: FrameStream) -> None:
        await frames.send(hello_from(LAPTOP))
        await anyio.sleep(0.5)

    outcome = await handshake_against(stalls, handshake_server, STUDIO, timeout_s=0.2)
    assert isinstance(outcome, HandshakeRefused) and outcome.peer == LAPTOP
    assert outcome.reason.endswith("waiting for laptop's proof")


async def record_a_challenge(nonce: str) -> Challenge:
    """What a real server with the key answers to a Hello carrying `nonce`."""
    recorded: list[Challenge] = []

    async def listener(frames: FrameStream) -> None:
        await frames.send(hello_from(LAPTOP, nonce=nonce))
        challenge = await frames.receive()
        assert isinstance(challenge, Challenge)
        recorded.append(challenge)
        await frames.aclose()

    outcome = await handshake_against(listener, handshake_server, STUDIO)
    assert not isinstance(outcome, PeerInfo)
    return recorded[0]


async def test_a_recorded_server_proof_fails_against_a_fresh_client_nonce() -> None:
    recorded = await record_a_challenge(NONCE)
    heard: list[Frame] = []

    async def replayer(frames: FrameStream) -> None:
        hello = await frames.receive()
        assert isinstance(hello, Hello) and hello.nonce != NONCE
        await frames.send(recorded)
        heard.append(await frames.receive())

    outcome = await handshake_against(replayer, handshake_client, LAPTOP)
    assert isinstance(outcome, HandshakeRefused) and outcome.foreign
    assert "claims our key fingerprint" in outcome.reason
    assert isinstance(heard[0], Refused)


async def test_a_server_proof_reflected_back_as_the_client_proof_fails() -> None:
    heard: list[Frame] = []

    async def reflector(frames: FrameStream) -> None:
        await frames.send(hello_from(LAPTOP))
        challenge = await frames.receive()
        assert isinstance(challenge, Challenge)
        await frames.send(Proof(proof=challenge.proof))
        heard.append(await frames.receive())

    outcome = await handshake_against(reflector, handshake_server, STUDIO)
    assert isinstance(outcome, HandshakeRefused) and outcome.foreign
    assert isinstance(heard[0], Refused)


async def test_a_session_frame_before_the_handshake_is_a_protocol_error() -> None:
    async def eager(frames: FrameStream) -> None:
        await frames.send(StatsFrame(stats=STATS))

    outcome = await handshake_against(eager, handshake_server, STUDIO)
    assert isinstance(outcome, ProtocolError)
    assert "stats frame during the handshake" in str(outcome)


async def test_a_peer_that_hangs_up_ends_the_handshake_with_end_of_stream() -> None:
    async def hangs_up(frames: FrameStream) -> None:
        await frames.aclose()

    outcome = await handshake_against(hangs_up, handshake_server, STUDIO)
    assert isinstance(outcome, anyio.EndOfStream)


# ---------------------------------------------------------------------- handshake fuzz

HEX = st.text("0123456789abcdef", min_size=64, max_size=64)
ANY_FRAME = st.one_of(
    st.builds(
        Hello,
        version=st.sampled_from([PROTOCOL_VERSION, PROTOCOL_VERSION + 1, 0, -1]),
        node_id=st.text(min_size=1, max_size=8),
        name=st.text(max_size=8),
        fingerprint=st.sampled_from([STUDIO.fingerprint, STRANGER.fingerprint]),
        nonce=HEX,
    ),
    st.builds(
        Challenge,
        version=st.sampled_from([PROTOCOL_VERSION, PROTOCOL_VERSION + 1]),
        node_id=st.text(min_size=1, max_size=8),
        name=st.text(max_size=8),
        fingerprint=st.sampled_from([STUDIO.fingerprint, STRANGER.fingerprint]),
        nonce=HEX,
        proof=HEX,
    ),
    st.builds(Proof, proof=HEX),
    st.just(Welcome()),
    st.builds(Refused, reason=st.text(max_size=20)),
    st.builds(Heartbeat, sent_at=st.floats(allow_nan=False, allow_infinity=False)),
    st.just(StatsFrame(stats=STATS)),
    st.builds(Goodbye, reason=st.text(max_size=20)),
)
WIRE_PIECE = st.one_of(
    ANY_FRAME.map(encode),
    st.binary(max_size=40).map(frame_payload),
    st.binary(max_size=40),
    st.just(HEADER.pack(MAX_FRAME_BYTES + 1)),
)
ENDINGS = (HandshakeRefused, ProtocolError, anyio.EndOfStream, anyio.IncompleteRead)


@FUZZ
@given(
    st.lists(WIRE_PIECE, max_size=5),
    st.integers(min_value=1, max_value=64),
    st.sampled_from(["server", "client"]),
)
def test_a_peer_without_the_key_only_ever_ends_the_handshake_cleanly(
    pieces: list[bytes], piece_size: int, side: str
) -> None:
    handshake, me = (handshake_server, STUDIO) if side == "server" else (handshake_client, LAPTOP)
    peer = ScriptedStream(b"".join(pieces), piece=piece_size)

    async def run() -> None:
        with pytest.raises(ENDINGS):
            await handshake(FrameStream(peer), KEY, *as_args(me), timeout_s=5.0)

    anyio.run(run)
    assert peer.closed  # no connection outlives a failed handshake
    assert all(not isinstance(frame, Welcome) for frame in frames_in(bytes(peer.heard)))


def test_handshake_frames_keep_the_fields_other_versions_read() -> None:
    # _claimed_version reads these from a frame it cannot decode; renaming them breaks it.
    for opening in (Hello, Challenge):
        assert {"type", "version", "name"} <= set(opening.model_fields)
