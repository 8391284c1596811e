"""Frames on a byte stream: a 4-byte big-endian length, then that many bytes of UTF-8 JSON.

Decoding is strict (no extra fields, no type coercion), and a frame over MAX_FRAME_BYTES is
refused from its header, before its body is read. Once the handshake has made the keys, every
frame is sealed (`sealed`).
"""

from __future__ import annotations

import struct

import anyio
import anyio.abc
from pydantic import TypeAdapter, ValidationError

from exo_tui.cluster.wire.frames import Frame
from exo_tui.cluster.wire.sealed import SealBroken, SealedChannel
from exo_tui.untrusted import shown

MAX_FRAME_BYTES = 4 * 1024 * 1024
# Until the handshake ends, frames come from anyone: an opening, even with a long name, is small.
MAX_HANDSHAKE_FRAME_BYTES = 8 * 1024
HEADER = struct.Struct(">I")  # payload length in bytes; the payload is UTF-8 JSON

_frames: TypeAdapter[Frame] = TypeAdapter(Frame)


class ProtocolError(Exception):
    """The peer sent something that is not a valid frame; the connection cannot go on."""


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
