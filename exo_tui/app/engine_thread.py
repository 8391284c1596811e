"""One thread for all of the app's MLX work, alive as long as the process.

MLX keeps per-thread caches of compiled functions (mlx-lm's samplers, mlx.nn's activations)
that let go of Python objects when their thread ends. A worker thread that ran MLX and ends as
the interpreter finalizes aborts the process (status 134, "terminate called without an active
exception"), and Python's join returns before those last steps of the thread have run, so
joining the workers is not enough. This thread never ends: at exit it waits, idle, for a job
that does not come, and the process ends around it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")


class EngineThread:
    """Started by its first job, so importing the app starts no thread."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._start = threading.Lock()
        self._thread: threading.Thread | None = None

    def run(self, work: Callable[[], T]) -> T:
        """Run `work` on the MLX thread, after the jobs before it; its result or its error."""
        with self._start:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="mlx", daemon=True)
                self._thread.start()
        future: Future[T] = Future()

        def job() -> None:
            try:
                future.set_result(work())
            except BaseException as error:  # handed to the caller, raised there
                future.set_exception(error)

        self._jobs.put(job)
        return future.result()

    def _serve(self) -> None:
        while True:
            self._jobs.get()()


ENGINE_THREAD = EngineThread()
