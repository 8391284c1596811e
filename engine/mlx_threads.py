"""Threads for MLX work that never end: a job runs on an idle one, or on a new one.

MLX keeps per-thread state (streams, compiled functions) that is torn down when its thread
ends, and Python's join returns before that teardown has run: an interpreter that exits during
it aborts ("terminate called without an active exception"). So a thread that has run MLX waits,
idle, for the next job instead of ending (as exo_tui/app/engine_thread.py does for the app).
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable

# How long a thread may hold the GIL while another waits for it (Python's default: 5 ms), for a
# process whose model thread shares the GIL with an event loop (the app's screen, the API's
# server). The model's thread needs it for a moment each token, between computations that run
# without it; at the default it waited out whole screen redraws, and streaming through the app
# fell behind the headless CLI (bench/tui_stream.py and bench/api.py measure it).
GIL_SWITCH_INTERVAL_S = 0.001

Jobs = queue.SimpleQueue[Callable[[], None]]
_idle: queue.SimpleQueue[Jobs] = queue.SimpleQueue()
_names = itertools.count()


def start(job: Callable[[], None]) -> None:
    """Run `job` on a thread of its own now; the thread stays for a later job when it ends."""
    try:
        jobs = _idle.get_nowait()
    except queue.Empty:
        jobs = Jobs()
        threading.Thread(
            target=_serve, args=(jobs,), name=f"mlx-{next(_names)}", daemon=True
        ).start()
    jobs.put(job)


def _serve(jobs: Jobs) -> None:
    while True:
        job = jobs.get()
        try:
            job()
        finally:
            _idle.put(jobs)
