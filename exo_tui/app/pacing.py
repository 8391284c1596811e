"""When streamed text goes to the screen: the first words at once, then within a budget.

Every redraw of a growing answer costs the screen's thread a layout and a repaint (more as the
answer grows: a table or a long list is ~50 widgets to place), and the engine about as much:
both want the same cores and the same GIL. So after the first batch, text waits at least
STREAM_INTERVAL, and longer when the screen's thread has been busy for more than SCREEN_BUDGET
of the time since the last batch (a costly redraw spaces the next ones out), but never longer
than MAX_WAIT: a screen kept busy by other work (the user typing, a long chat laid out again)
would hold the words back for as long as it stays busy. Where a thread's CPU clock cannot be
read (macOS), the interval alone paces.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# Four redraws a second still read as a live stream.
STREAM_INTERVAL = 1 / 4
# The share of the time the screen's thread may be busy while an answer streams.
SCREEN_BUDGET = 0.05
# The longest the words wait for the screen: the stream still moves.
MAX_WAIT = 2.0


def thread_cpu_clock(thread: threading.Thread) -> Callable[[], float] | None:
    """Seconds of CPU `thread` has used so far, read from any thread; None where unsupported."""
    try:
        clock = time.pthread_getcpuclockid(thread.ident or 0)
        time.clock_gettime(clock)
    except (AttributeError, OSError):
        return None
    return lambda: time.clock_gettime(clock)


class RedrawPacer:
    """Decides, for the thread that streams an answer, when its batch of text is due."""

    def __init__(
        self,
        screen_cpu: Callable[[], float] | None,
        interval: float = STREAM_INTERVAL,
        budget: float = SCREEN_BUDGET,
        max_wait: float = MAX_WAIT,
    ) -> None:
        self._screen_cpu = screen_cpu
        self._interval = interval
        self._budget = budget
        self._max_wait = max_wait
        self._last: tuple[float, float] | None = None  # wall and screen CPU at the last batch

    def due(self, now: float) -> bool:
        if self._last is None:
            return True
        wall, cpu = self._last
        elapsed = now - wall
        if elapsed < self._interval:
            return False
        if self._screen_cpu is None or elapsed >= self._max_wait:
            return True
        return self._screen_cpu() - cpu <= self._budget * elapsed

    def sent(self, now: float) -> None:
        self._last = (now, self._screen_cpu() if self._screen_cpu is not None else 0.0)
