"""A hostile relay for tests: a TCP proxy between two nodes that can read, inject, drop, replay,
reorder and change the frames of the first connection through it (later ones pass untouched)."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable

HEADER = struct.Struct(">I")

# (index of the frame in its direction, the frame's bytes) -> the bytes to send on instead.
Attack = Callable[[int, bytes], bytes]


def forward(index: int, frame: bytes) -> bytes:
    return frame


class Relay:
    """Listens on 127.0.0.1; every connection is joined to `target`. The first connection's
    frames from the dialer pass through `to_server`, and the listener's through `to_client`."""

    def __init__(
        self, target: tuple[str, int], to_server: Attack = forward, to_client: Attack = forward
    ) -> None:
        self.target = target
        self.attacks = (to_server, to_client)
        self.seen: list[bytes] = []  # every frame of the first connection, both ways, as sent
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                dialer, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            first = self.connections == 1
            listener = socket.create_connection(self.target)
            self._sockets += [dialer, listener]
            to_server, to_client = self.attacks if first else (forward, forward)
            ways = ((dialer, listener, to_server), (listener, dialer, to_client))
            for source, sink, attack in ways:
                threading.Thread(
                    target=self._pump, args=(source, sink, attack, first), daemon=True
                ).start()

    def _pump(
        self, source: socket.socket, sink: socket.socket, attack: Attack, record: bool
    ) -> None:
        buffer = b""
        index = 0
        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                buffer += chunk
                while len(buffer) >= HEADER.size:
                    (length,) = HEADER.unpack_from(buffer)
                    if len(buffer) < HEADER.size + length:
                        break
                    frame, buffer = buffer[: HEADER.size + length], buffer[HEADER.size + length :]
                    sent = attack(index, frame)
                    index += 1
                    if record:
                        self.seen.append(sent)
                    sink.sendall(sent)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()
