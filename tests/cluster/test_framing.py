"""Frames on a byte stream, over real loopback sockets: whole, in order, within the limits."""

from __future__ import annotations

import socket
import struct

import anyio
import anyio.abc
import pytest

from exo_tui.cluster.wire.frames import (
    FetchDone,
    Goodbye,
    Welcome,
)
from exo_tui.cluster.wire.framing import (
    HEADER,
    MAX_FRAME_BYTES,
    FrameStream,
    ProtocolError,
    encode,
)
from tests.cluster.wire_ends import (
    EVERY_FRAME,
    ScriptedStream,
    frame_pair,
    frame_payload,
    tcp_pair,
)

pytestmark = pytest.mark.anyio


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
        await client.send(encode(FetchDone(instance_id="i1"))[:-3])
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


async def test_a_malformed_frame_on_the_wire_is_a_protocol_error() -> None:
    async with tcp_pair() as (client, server):
        await client.send(frame_payload(b'{"type": "launch"}'))
        with pytest.raises(ProtocolError, match="launch"):
            await FrameStream(server).receive()
