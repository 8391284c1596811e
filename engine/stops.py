"""Stop strings: the answer's text ends before the first of them, which is never shown."""

from __future__ import annotations

from collections.abc import Sequence


class StopText:
    """Feed it the answer's text as it streams; it gives back what may be shown so far.

    Text that could be the start of a stop string is held back until the next text decides it
    (a stop string may arrive split across tokens)."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held: str = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """The text that may be shown now; after a stop string, `stopped` and nothing more."""
        if self.stopped:
            return ""
        if not self._stops:
            return text
        text = self._held + text
        found = [index for s in self._stops if (index := text.find(s)) >= 0]
        if found:
            self.stopped = True
            self._held = ""
            return text[: min(found)]
        keep = max(_overlap(text, s) for s in self._stops)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def flush(self) -> str:
        """What was held back: the answer ended without the stop string it might have begun."""
        held, self._held = self._held, ""
        return "" if self.stopped else held


def _overlap(text: str, stop: str) -> int:
    """The length of the longest end of `text` that `stop` starts with (shorter than `stop`)."""
    for length in range(min(len(text), len(stop) - 1), 0, -1):
        if stop.startswith(text[-length:]):
            return length
    return 0
