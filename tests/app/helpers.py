"""Helpers for app tests: fixed node stats, and waiting on a condition instead of sleeping."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from time import monotonic
from typing import Any

from textual.pilot import Pilot

from engine.generate import CancelToken
from engine.types import ChatRequest, Chunk, PrefillProgress
from exo_tui.chat.backend import Backend, Deliver, answer_on_a_thread
from exo_tui.cluster.control.state import NodeStats

GB = 10**9


def fixed_stats(
    available: int = 12 * GB, total: int = 16 * GB
) -> Callable[[Sequence[str]], NodeStats]:
    """Node stats that do not change, so screens are the same on every run."""

    def stats(models: Sequence[str]) -> NodeStats:
        return NodeStats(
            node_id="node-a",
            name="studio",
            backend="cpu",
            blas="openblas",
            kernels="avx512 (2 threads)",
            memory_total_bytes=total,
            memory_available_bytes=available,
            models=tuple(models),
        )

    return stats


async def wait_until(
    pilot: Pilot[None], predicate: Callable[[], bool], timeout: float = 30.0
) -> None:
    deadline = monotonic() + timeout
    while not predicate():
        if monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await pilot.pause(0.02)


class HeldBackend:
    """The loaded model, held until the test lets it go (or the turn is stopped): a turn that
    is answering for as long as the test needs, on any machine."""

    def __init__(self, backend: Backend, held: bool = True, after: int = 0) -> None:
        """`held` False: it answers at once, and only records the requests. `after`: how many
        chunks it lets through before it holds (the prefill's progress aside)."""
        self._backend = backend
        self._after = after
        self.go = threading.Event()
        if not held:
            self.go.set()
        self.requests: list[ChatRequest] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def answer(self, request: ChatRequest, cancel: CancelToken, deliver: Deliver) -> bool:
        return answer_on_a_thread(self.generate, request, cancel, deliver)

    def generate(self, request: ChatRequest, cancel: CancelToken | None) -> Iterator[Chunk]:
        self.requests.append(request)
        chunks = self._backend.generate(request, cancel)
        let_through = 0
        while let_through < self._after:
            chunk = next(chunks, None)
            if chunk is None:
                return
            let_through += not isinstance(chunk, PrefillProgress)
            yield chunk
        while not self.go.wait(0.01):
            if cancel is not None and cancel.is_set():  # stopped, or the app quits
                break
        yield from chunks
