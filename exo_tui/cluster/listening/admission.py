"""Connections that have not finished the handshake: how many are held, per address and in all.

A connection that has not proved the key costs a descriptor and a buffer until its handshake
ends or times out. A flood of idle connections must neither take every descriptor nor crowd out
a real peer, so each address holds a few and all addresses together a share of the file limit. A
new connection over either cap closes the oldest one held (of its own address, or else of the
address holding the most): the newest, a real peer's most likely, always gets its chance, and a
flood only ever displaces itself.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from contextlib import contextmanager

import anyio

from exo_tui.cluster.listening.file_limit import soft_file_limit

PER_ADDRESS = 16
TOTAL = 256
FILE_LIMIT_SHARE = 8  # connections not yet trusted get at most 1/8 of the file limit


class Admission:
    """The places held by connections whose handshake is running, by remote address."""

    def __init__(self, per_address: int = PER_ADDRESS, total: int = TOTAL) -> None:
        self.per_address = per_address
        self.total = total
        self.displaced = 0  # connections closed to make room, since the start
        self._held: dict[str, deque[anyio.CancelScope]] = {}
        self._count = 0

    @property
    def count(self) -> int:
        return self._count

    def cap(self) -> int:
        """How many may be held now: `total`, or less where the file limit is low."""
        return max(1, min(self.total, soft_file_limit() // FILE_LIMIT_SHARE))

    @contextmanager
    def place(self, address: str) -> Generator[None]:
        """Hold a place for a connection from `address` while the block (its handshake) runs.

        The block is cancelled, and ends quietly, when a newer connection takes the place."""
        self._make_room(address)
        scope = anyio.CancelScope()
        self._held.setdefault(address, deque()).append(scope)
        self._count += 1
        try:
            with scope:
                yield
        finally:
            self._release(address, scope)

    def _make_room(self, address: str) -> None:
        own = self._held.get(address)
        if own is not None and len(own) >= self.per_address:
            self._displace(address)
        cap = self.cap()
        while self._count >= cap:
            busiest = max(self._held, key=lambda held: len(self._held[held]))
            self._displace(busiest)

    def _displace(self, address: str) -> None:
        held = self._held[address]
        held.popleft().cancel()
        self._count -= 1
        self.displaced += 1
        if not held:
            del self._held[address]

    def _release(self, address: str, scope: anyio.CancelScope) -> None:
        held = self._held.get(address)
        if held is None or scope not in held:
            return  # displaced already
        held.remove(scope)
        self._count -= 1
        if not held:
            del self._held[address]
