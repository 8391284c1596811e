"""Threads the app must let finish before it quits: MLX work and history writes.

MLX computing in a thread while the interpreter ends aborts the process (status 134,
"terminate called without an active exception"), and a history write cut short loses the
turn. Each such worker runs inside ``running()``; quitting calls ``close()``, which refuses new
work and waits for the work in flight.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class WorkInFlight:
    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._running = 0
        self._closed = False

    @contextmanager
    def running(self) -> Iterator[bool]:
        """Count the block as work in flight; yields False (run nothing) once closing."""
        with self._changed:
            entered = not self._closed
            if entered:
                self._running += 1
        try:
            yield entered
        finally:
            if entered:
                with self._changed:
                    self._running -= 1
                    self._changed.notify_all()

    def close(self, timeout: float) -> bool:
        """Refuse new work and wait for what runs; False when it still ran after `timeout`."""
        with self._changed:
            self._closed = True
            return self._changed.wait_for(lambda: self._running == 0, timeout)
