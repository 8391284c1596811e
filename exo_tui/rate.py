"""Rates for things that come in floods (a peer refused at every attempt, a flood of bad
connections): at most one notice or log line per interval, saying how many it held back.

A few lines of our own: no rate-limiting library is among the project's dependencies, and an
interval with a count of what it held back is all a pop-up or a log line needs.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable


class NoticeRate:
    """At most one notice every `every_s` seconds; the next one allowed says how many it held."""

    def __init__(self, every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self._clock = clock
        self._last: float | None = None
        self.held_back = 0

    def allow(self) -> int | None:
        """None when a notice now would be too soon (it is counted); else how many were held
        back since the last one allowed."""
        now = self._clock()
        if self._last is not None and now - self._last < self.every_s:
            self.held_back += 1
            return None
        self._last = now
        held, self.held_back = self.held_back, 0
        return held


class RatePerKey:
    """A NoticeRate for each key (an address), for the `keys` keys used most recently."""

    def __init__(
        self, every_s: float, keys: int = 1024, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.every_s = every_s
        self.keys = keys
        self._clock = clock
        self._rates: OrderedDict[str, NoticeRate] = OrderedDict()

    def allow(self, key: str) -> int | None:
        rate = self._rates.pop(key, None) or NoticeRate(self.every_s, self._clock)
        self._rates[key] = rate
        while len(self._rates) > self.keys:
            self._rates.popitem(last=False)
        return rate.allow()
