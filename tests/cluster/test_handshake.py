"""The mutual-HMAC handshake over real loopback sockets: only who holds the key gets a session."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import anyio
import anyio.abc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exo_tui.cluster.wire.frames import (
    PROTOCOL_VERSION,
    Challenge,
    Frame,
    Goodbye,
    Hello,
    Proof,
    Refused,
    StatsFrame,
    StopInstance,
    Welcome,
)
from exo_tui.cluster.wire.framing import (
    HEADER,
    MAX_FRAME_BYTES,
    MAX_HANDSHAKE_FRAME_BYTES,
    FrameStream,
    ProtocolError,
    encode,
)
from exo_tui.cluster.wire.handshake import (
    HandshakeRefused,
    PeerInfo,
    handshake_client,
    handshake_server,
)
from tests.cluster.wire_ends import (
    FUZZ,
    KEY,
    LAPTOP,
    NONCE,
    OTHER_KEY,
    STATS,
    STRANGER,
    STUDIO,
    ScriptedStream,
    as_args,
    fingerprint,
    frame_payload,
    frames_in,
    hello_from,
    tcp_pair,
)

pytestmark = pytest.mark.anyio


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
        await client.send(StopInstance(instance_id="i1"))
        await server.send(StatsFrame(stats=STATS))
        assert await server.receive() == StopInstance(instance_id="i1")
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
    assert client.peer == STUDIO
    assert client.reason.startswith("studio (node-studio) is foreign: ")
    assert f"its key fingerprint {STUDIO.fingerprint} differs from ours" in client.reason
    assert "`exo-tui key`" in client.reason and "--key" in client.reason
    assert "EXO_TUI_KEY" in client.reason
    assert isinstance(server, HandshakeRefused)
    assert server.peer == STRANGER
    assert server.reason.startswith("refused by stranger: wrong cluster key")
    # Both connections are closed: no session frame can follow.
    for frames in (client_frames, server_frames):
        with pytest.raises(anyio.ClosedResourceError):
            await frames.receive()


async def test_an_impostor_claiming_our_fingerprint_is_refused_by_its_proof() -> None:
    impostor = PeerInfo(node_id="node-x", name="impostor", fingerprint=STUDIO.fingerprint)
    client, server, _, _ = await run_handshake(client_key=OTHER_KEY, client=impostor)
    assert isinstance(client, HandshakeRefused)
    assert "studio (node-studio) is foreign: it claims our key fingerprint" in client.reason
    assert isinstance(server, HandshakeRefused) and server.peer == impostor
    assert server.reason.startswith("refused by impostor: wrong cluster key")


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
    assert isinstance(outcome, HandshakeRefused)
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
    assert isinstance(outcome, HandshakeRefused)
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
    assert isinstance(outcome, HandshakeRefused)
    assert "studio (node-studio) is foreign: it claims our key fingerprint" in outcome.reason
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
    assert isinstance(outcome, HandshakeRefused)
    assert "laptop (node-laptop) is foreign: it claims our key fingerprint" in outcome.reason
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
    st.builds(StopInstance, instance_id=st.text(max_size=8)),
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
