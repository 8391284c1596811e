"""Fixtures for the API's tests: the demo model and a tiny one behind LocalBackend, a real
uvicorn on a free loopback port, a backend that holds its answers until a test lets go, and one
that hands its tokens over at a set pace."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engine.generate import CancelToken
from engine.loading import load_model, run_loading
from engine.models.locations import bundled_demo_dir
from engine.types import ChatRequest, Chunk, ModelCard
from exo_tui.api.board import RequestBoard
from exo_tui.api.scheduler import Scheduler
from exo_tui.api.server import ApiServer, scheduler_of, start_api
from exo_tui.chat.backend import Backend, Deliver, LocalBackend, answer_on_a_thread


@pytest.fixture(scope="session")
def demo_backend() -> Iterator[LocalBackend]:
    backend = LocalBackend(run_loading(load_model(bundled_demo_dir()), lambda _: None))
    yield backend
    backend.unload()


@pytest.fixture(scope="session")
def tiny_backend(tiny_llama: Path) -> Iterator[LocalBackend]:
    """Random weights whose greedy answer to "hi" never ends a turn: it runs until max_tokens or
    a cancel (sampled, it may end: its end-of-turn tokens are as likely as any)."""
    backend = LocalBackend(run_loading(load_model(tiny_llama), lambda _: None))
    yield backend
    backend.unload()


class Served:
    def __init__(self, server: ApiServer, board: RequestBoard) -> None:
        self.server = server
        self.board = board
        self.url = server.url

    @property
    def scheduler(self) -> Scheduler:
        return scheduler_of(self.server.app)


Serve = Callable[..., Served]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """`serve(backend_or_None, api_key=..., max_waiting=...)`: a real server on 127.0.0.1:0."""
    started: list[ApiServer] = []

    def start(backend: Backend | None, **options: object) -> Served:
        board = RequestBoard()
        server = start_api(lambda: backend, board, "127.0.0.1", 0, **options)  # type: ignore[arg-type]
        started.append(server)
        return Served(server, board)

    yield start
    for server in started:
        server.stop()


class HeldBackend:
    """The real backend, but each answer waits at its start until the test lets it go: the
    queue's tests then know which request holds the slot."""

    def __init__(self, inner: Backend, concurrency: int | None = None) -> None:
        self.inner = inner
        self._concurrency = concurrency
        self.go = threading.Event()
        self.started = threading.Semaphore(0)

    @property
    def card(self) -> ModelCard:
        return self.inner.card

    @property
    def concurrency(self) -> int:
        return self._concurrency or self.inner.concurrency

    def answer(self, request: ChatRequest, cancel: CancelToken, deliver: Deliver) -> bool:
        return answer_on_a_thread(self.generate, request, cancel, deliver)

    def generate(self, request: ChatRequest, cancel: CancelToken | None) -> Iterator[Chunk]:
        self.started.release()
        self.go.wait()
        yield from self.inner.generate(request, cancel)

    def prefill_next(self, request: ChatRequest, draft: str = "") -> None: ...

    def stop_prefill(self) -> None: ...

    def forget_history(self) -> None: ...

    def unload(self) -> None: ...


class PacedBackend:
    """The real backend on its own path (`answer`, batched), each chunk handed over no sooner
    than `seconds` after the last, and only once `gate` is open: a test that must act while an
    answer runs then does not race the tiny model, which is fast enough to finish first on a
    busy machine."""

    def __init__(self, inner: LocalBackend, seconds: float = 0.0) -> None:
        self.inner = inner
        self.seconds = seconds
        self.gate = threading.Event()
        self.gate.set()

    @property
    def card(self) -> ModelCard:
        return self.inner.card

    @property
    def concurrency(self) -> int:
        return self.inner.concurrency

    def answer(self, request: ChatRequest, cancel: CancelToken, deliver: Deliver) -> bool:
        def paced(chunk: Chunk | Exception) -> None:
            self.gate.wait()
            time.sleep(self.seconds)
            deliver(chunk)

        return self.inner.answer(request, cancel, paced)
