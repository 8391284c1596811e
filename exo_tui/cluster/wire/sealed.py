"""The session's seal: every frame after the handshake is encrypted and authenticated.

Keys come from the handshake: HKDF-SHA256 over the cluster key, salted with both nonces and bound
to the whole transcript, gives one ChaCha20-Poly1305 key per direction. Each direction counts its
frames, and the count is the frame's nonce, never sent: a frame injected, dropped, replayed or
moved by a relay is opened under the wrong count and fails its tag. The frame's length header is
the associated data, so it cannot be changed either.

ChaCha20-Poly1305 from `cryptography` (OpenSSL underneath): an AEAD with a 96-bit nonce that needs
no AES hardware to be fast, so it suits every machine of a cluster, and counters make nonce reuse
impossible within a session. Fresh nonces on both sides make every session's keys new.
"""

# pyright: strict

from __future__ import annotations

import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

TAG_BYTES = 16  # Poly1305's tag, appended to every sealed payload
_KEY_BYTES = 32
_INFO = b"exo-tui session keys v1\0"
_COUNTER = struct.Struct(">4xQ")  # 96-bit nonce: four zero bytes, then the frame's 64-bit count
_LAST_COUNT = 2**64 - 1


class SealBroken(Exception):
    """A sealed frame did not open: it was changed, injected, replayed or reordered on the way,
    or the channel has run out of counts."""


class SealedChannel:
    """Seals what one side sends and opens what it receives, each direction with its own key and
    its own count. Not thread-safe: the caller seals in send order and opens in receive order."""

    def __init__(self, send_key: bytes, receive_key: bytes) -> None:
        self._send = ChaCha20Poly1305(send_key)
        self._receive = ChaCha20Poly1305(receive_key)
        self._sent = 0
        self._received = 0

    @classmethod
    def from_handshake(
        cls, key: bytes, client_nonce: str, server_nonce: str, transcript: bytes, *, client: bool
    ) -> SealedChannel:
        """The channel of one side (`client` or server) of the handshake just completed."""
        salt = bytes.fromhex(client_nonce) + bytes.fromhex(server_nonce)
        derived = HKDF(
            algorithm=hashes.SHA256(), length=2 * _KEY_BYTES, salt=salt, info=_INFO + transcript
        ).derive(key)
        to_server, to_client = derived[:_KEY_BYTES], derived[_KEY_BYTES:]
        if client:
            return cls(send_key=to_server, receive_key=to_client)
        return cls(send_key=to_client, receive_key=to_server)

    def seal(self, payload: bytes, header: bytes) -> bytes:
        """`payload` encrypted under the next send count, with `header` authenticated beside it."""
        if self._sent > _LAST_COUNT:
            raise SealBroken("this session has sent all the frames one key may seal; reconnect")
        sealed = self._send.encrypt(_COUNTER.pack(self._sent), payload, header)
        self._sent += 1
        return sealed

    def open(self, sealed: bytes, header: bytes) -> bytes:
        """The payload of the next frame received; SealBroken when it fails its tag."""
        if self._received > _LAST_COUNT:
            raise SealBroken("this session has received all the frames one key may seal")
        try:
            payload = self._receive.decrypt(_COUNTER.pack(self._received), sealed, header)
        except InvalidTag:
            raise SealBroken(
                f"frame {self._received} of the session failed its authentication tag: it was "
                "changed, injected, replayed or reordered on the way (or the peer's key differs)"
            ) from None
        self._received += 1
        return payload

    @staticmethod
    def sealed_size(payload_size: int) -> int:
        return payload_size + TAG_BYTES
