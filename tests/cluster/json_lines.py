"""Reading a child process's JSON lines with deadlines, for tests."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable
from typing import IO, Any

Line = dict[str, Any]


class JsonLines:
    """Collects the JSON lines of a stream in a thread; tests wait on them with a timeout."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[Line] = []
        self._arrived: queue.Queue[Line | None] = queue.Queue()
        self._ended = False
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        try:
            for text in stream:
                if text.strip():
                    self._arrived.put(json.loads(text))
        except (ValueError, OSError):
            pass  # a closed or garbled stream ends the reading; the test sees no more lines
        finally:
            self._arrived.put(None)

    def wait_for(self, predicate: Callable[[list[Line]], bool], timeout: float) -> list[Line]:
        """Wait until predicate(lines so far) holds; fails with the lines seen if it never does."""
        deadline = time.monotonic() + timeout
        while not predicate(self.lines):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._ended:
                raise AssertionError(f"timed out after {timeout} s; lines: {self.lines}")
            try:
                line = self._arrived.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                self._ended = True
            else:
                self.lines.append(line)
        return self.lines

    def events(self, kind: str) -> list[Line]:
        return [line for line in self.lines if line["event"] == kind]
