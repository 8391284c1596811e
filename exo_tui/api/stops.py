"""Stop strings: the answer ends before the first of them, which is never sent.

The engine receives them in `ChatRequest.stop`; this cut on the streamed text makes them hold on
every backend, whichever honours them itself (one that does never lets this cut see them).
"""

from __future__ import annotations


class StopCut:
    """Feed text pieces; get what is safe to send. Text that may be the start of a stop string
    is held back until the next piece tells."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.hit = False

    def feed(self, text: str) -> str:
        if self.hit:
            return ""
        if not self._stops:
            return text
        buffer = self._held + text
        found = [i for i in (buffer.find(s) for s in self._stops) if i >= 0]
        if found:
            self.hit = True
            self._held = ""
            return buffer[: min(found)]
        keep = self._partial_suffix(buffer)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep]

    def finish(self) -> str:
        """What was held back, once the answer ended without a stop string."""
        held, self._held = self._held, ""
        return "" if self.hit else held

    def _partial_suffix(self, buffer: str) -> int:
        """The length of the longest end of `buffer` that begins some stop string."""
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:size]):
                    longest = size
                    break
        return longest
