"""Items from a worker thread to the event loop: put there, taken here in batches, with one
wake-up of the loop per batch however many came (a slow reader costs the writer nothing)."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class Inbox(Generic[T]):
    """Made on the loop's thread; `put` from any thread, `take` and `hold` on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: deque[T] = deque()
        # A wake-up is on its way to the loop, or none is wanted (a hold takes what comes).
        self._waking = False
        self._ready = asyncio.Event()
        self._ended = False  # the last item is in
        self._held: asyncio.Future[None] | None = None  # the hold under way

    def put(self, item: T, last: bool = False) -> bool:
        """False once the loop has closed (nobody will take it). `last`: nothing follows."""
        self._items.append(item)
        if last:
            try:
                self._loop.call_soon_threadsafe(self._end)
            except RuntimeError:
                return False
        if self._waking:
            return True
        self._waking = True
        try:
            self._loop.call_soon_threadsafe(self._ready.set)
        except RuntimeError:
            return False
        return True

    async def hold(self, seconds: float) -> None:
        """Let items gather for up to `seconds`; back at once when the last is in. One timer,
        and what is put meanwhile does not wake the loop: on two cores each wake-up of the
        loop's thread takes the GIL from the model's (bench/api.py)."""
        if seconds <= 0 or self._ended:
            return
        self._waking = True
        held = self._held = self._loop.create_future()
        timer = self._loop.call_later(seconds, _resolve, held)
        try:
            await held
        finally:
            timer.cancel()
            self._held = None

    def take_ready(self) -> list[T]:
        """Everything put so far, in order (perhaps nothing); never waits."""
        batch: list[T] = []
        while self._items:
            batch.append(self._items.popleft())
        return batch

    async def take(self, within: float | None = None) -> list[T]:
        """Everything put so far, in order; waits for at least one item, or for `within`
        seconds at most (then nothing)."""
        timed_out = False

        def time_out() -> None:
            nonlocal timed_out
            timed_out = True
            self._ready.set()

        timer = None if within is None else self._loop.call_later(within, time_out)
        try:
            while True:
                # Cleared before the items are taken: whatever is put after this wakes us again.
                self._waking = False
                batch = self.take_ready()
                if batch or timed_out:
                    return batch
                self._ready.clear()
                await self._ready.wait()
        finally:
            if timer is not None:
                timer.cancel()

    def _end(self) -> None:
        self._ended = True
        if self._held is not None:
            _resolve(self._held)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
