"""The sealed channel under a relay's every trick: whatever is done to the bytes of a session, the
receiver yields only frames the sender sent, in the order sent, then refuses the rest."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exo_tui.cluster.wire.frames import FetchDone, Frame, Goodbye, StatsFrame, StopInstance, Welcome
from exo_tui.cluster.wire.framing import HEADER, FrameStream, ProtocolError, encode
from exo_tui.cluster.wire.sealed import SealedChannel
from tests.cluster.wire_ends import EVERY_FRAME, NONCE, STATS, ScriptedStream

KEY = b"k" * 32
OTHER_NONCE = "cd" * 32
TRANSCRIPT = b'["a transcript"]'
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SESSION_FRAMES: list[Frame] = [
    FetchDone(instance_id="i1"),
    StatsFrame(stats=STATS),
    Goodbye(reason="done"),
    StopInstance(instance_id="i1"),
]


def channel(client: bool, key: bytes = KEY) -> SealedChannel:
    return SealedChannel.from_handshake(key, NONCE, OTHER_NONCE, TRANSCRIPT, client=client)


def sealed_frames(frames: list[Frame]) -> list[bytes]:
    """Each frame as the client's FrameStream puts it on the wire, header and all."""

    async def seal() -> list[bytes]:
        wire = ScriptedStream(b"")
        sender = FrameStream(wire)
        sender.seal(channel(client=True))
        pieces: list[bytes] = []
        for frame in frames:
            before = len(wire.heard)
            await sender.send(frame)
            pieces.append(bytes(wire.heard[before:]))
        return pieces

    return anyio.run(seal)


def received(data: bytes, piece: int = 1 << 16) -> tuple[list[Frame], BaseException | None]:
    """What the server's FrameStream yields from `data`, and how it stopped."""

    async def receive() -> tuple[list[Frame], BaseException | None]:
        frames = FrameStream(ScriptedStream(data, piece=piece))
        frames.seal(channel(client=False))
        got: list[Frame] = []
        while True:
            try:
                got.append(await frames.receive())
            except (ProtocolError, anyio.EndOfStream, anyio.IncompleteRead) as error:
                return got, error

    return anyio.run(receive)


def test_untouched_frames_arrive_whole_and_in_order_even_byte_by_byte() -> None:
    wire = b"".join(sealed_frames(EVERY_FRAME))
    for piece in (1, 7, 1 << 16):
        got, ending = received(wire, piece)
        assert got == EVERY_FRAME
        assert isinstance(ending, anyio.EndOfStream)


def test_nothing_of_a_sealed_frame_is_readable() -> None:
    for frame, sealed in zip(EVERY_FRAME, sealed_frames(EVERY_FRAME), strict=True):
        plain = encode(frame)[HEADER.size :]
        assert plain not in sealed and frame.type.encode() not in sealed
        assert len(sealed) == len(plain) + HEADER.size + 16  # the tag; the length is no secret


def test_the_two_directions_have_different_keys() -> None:
    # A frame the client sealed, reflected back to the client, does not open there.
    reflected = sealed_frames([Welcome()])[0]

    async def receive_as_client() -> None:
        frames = FrameStream(ScriptedStream(reflected))
        frames.seal(channel(client=True))
        with pytest.raises(ProtocolError, match="authentication tag"):
            await frames.receive()

    anyio.run(receive_as_client)


def test_another_key_opens_nothing() -> None:
    sealed = sealed_frames([Welcome()])[0]

    async def receive_with_another_key() -> None:
        frames = FrameStream(ScriptedStream(sealed))
        frames.seal(channel(client=False, key=b"o" * 32))
        with pytest.raises(ProtocolError, match="authentication tag"):
            await frames.receive()

    anyio.run(receive_with_another_key)


def drop(pieces: list[bytes], at: int, _: bytes) -> list[bytes]:
    return pieces[:at] + pieces[at + 1 :]


def replay(pieces: list[bytes], at: int, _: bytes) -> list[bytes]:
    earlier = pieces[at // 2]  # a frame already delivered, or this one, sent again
    return pieces[: at + 1] + [earlier] + pieces[at + 1 :]


def swap(pieces: list[bytes], at: int, _: bytes) -> list[bytes]:
    at = min(at, len(pieces) - 2)  # this frame and the next, or the last two
    return pieces[:at] + [pieces[at + 1], pieces[at]] + pieces[at + 2 :]


def flip(pieces: list[bytes], at: int, noise: bytes) -> list[bytes]:
    frame = bytearray(pieces[at])
    position = int.from_bytes(noise[:4] or b"\0", "big") % len(frame)
    frame[position] ^= 1 << (noise[-1] % 8 if noise else 0)
    return pieces[:at] + [bytes(frame)] + pieces[at + 1 :]


def inject_plain(pieces: list[bytes], at: int, noise: bytes) -> list[bytes]:
    frame = EVERY_FRAME[(noise[0] if noise else 0) % len(EVERY_FRAME)]
    return pieces[:at] + [encode(frame)] + pieces[at:]


def inject_noise(pieces: list[bytes], at: int, noise: bytes) -> list[bytes]:
    return pieces[:at] + [HEADER.pack(len(noise)) + noise] + pieces[at:]


def truncate(pieces: list[bytes], at: int, noise: bytes) -> list[bytes]:
    cut = 1 + int.from_bytes(noise[:2] or b"\0", "big") % (len(pieces[at]) - 1)
    return pieces[:at] + [pieces[at][:cut]]


Attack = Callable[[list[bytes], int, bytes], list[bytes]]
ATTACKS: list[Attack] = [drop, replay, swap, flip, inject_plain, inject_noise, truncate]


@FUZZ
@given(
    st.lists(st.sampled_from(SESSION_FRAMES), min_size=2, max_size=6),
    st.sampled_from(ATTACKS),
    st.integers(min_value=0, max_value=5),
    st.binary(max_size=48),
    st.integers(min_value=1, max_value=64),
)
def test_a_relay_gets_nothing_past_the_seal(
    frames: list[Frame], attack: Attack, at: int, noise: bytes, piece: int
) -> None:
    pieces = sealed_frames(frames)
    at = at % len(pieces)
    tampered = attack(pieces, at, noise)
    assert tampered != pieces
    got, ending = received(b"".join(tampered), piece)
    # Only frames the sender sent, in its order, and none past the first change.
    assert got == frames[: len(got)]
    assert len(got) <= (at + 1 if attack is replay else at)
    if attack is drop and at == len(pieces) - 1:
        # The last frame gone looks like a close: in a session, the next stats frame (one a
        # second) comes under the wrong count and is refused.
        assert isinstance(ending, anyio.EndOfStream)
    else:
        assert isinstance(ending, (ProtocolError, anyio.IncompleteRead)), (attack, ending)
