"""The requests the API is serving, live: what the TUI's requests panel shows and where Esc cancels.

The server writes each request's progress here from its own threads; a reader takes a snapshot
(frozen records) or subscribes to be told that something changed.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import Literal

from engine.types import Frozen

RequestState = Literal["queued", "prefilling", "answering", "done", "cancelled", "error"]
FINISHED: frozenset[RequestState] = frozenset({"done", "cancelled", "error"})
KEPT_FINISHED = 50  # finished requests stay on the board, the newest this many


class ServedRequest(Frozen):
    """One API request as the panel shows it."""

    id: str
    api: Literal["openai", "ollama"]
    model: str
    client: str  # the peer's address and, when it sent one, its User-Agent
    state: RequestState
    queue_position: int | None = None  # 1: next to run; None once it runs
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tokens_per_second: float = 0.0
    started_at: float  # time.time()
    detail: str = ""  # the error's text, or the finish reason


class RequestBoard:
    """Thread-safe: the server's threads update it, the TUI reads it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[str, ServedRequest] = {}
        self._cancels: dict[str, threading.Event] = {}
        self._listeners: list[Callable[[], None]] = []
        self._ids = itertools.count(1)

    def open(
        self, api: Literal["openai", "ollama"], model: str, client: str, cancel: threading.Event
    ) -> ServedRequest:
        """A new request, queued; `cancel` is set when someone cancels it from the board."""
        with self._lock:
            request = ServedRequest(
                id=f"req-{next(self._ids)}",
                api=api,
                model=model,
                client=client,
                state="queued",
                started_at=time.time(),
            )
            self._requests[request.id] = request
            self._cancels[request.id] = cancel
            self._forget_old_finished()
        self._changed()
        return request

    def update(self, request_id: str, **changes: object) -> None:
        """Change a request's fields (state, tokens, queue position, ...)."""
        with self._lock:
            current = self._requests.get(request_id)
            if current is None:
                return
            self._requests[request_id] = current.model_copy(update=changes)
            if self._requests[request_id].state in FINISHED:
                self._cancels.pop(request_id, None)
        self._changed()

    def cancel(self, request_id: str) -> bool:
        """Cancel a request that is still queued or running; False if it had finished."""
        with self._lock:
            cancel = self._cancels.get(request_id)
        if cancel is None:
            return False
        cancel.set()
        return True

    def snapshot(self) -> tuple[ServedRequest, ...]:
        """Every request on the board, oldest first."""
        with self._lock:
            return tuple(self._requests.values())

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call `listener` (from the updating thread) after every change."""
        with self._lock:
            self._listeners.append(listener)

    def _forget_old_finished(self) -> None:
        finished = [r.id for r in self._requests.values() if r.state in FINISHED]
        for request_id in finished[: max(0, len(finished) - KEPT_FINISHED)]:
            del self._requests[request_id]

    def _changed(self) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener()
