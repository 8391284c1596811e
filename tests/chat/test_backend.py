"""The backends: a local model's prefills stop with a turn; a cluster's chunks (and errors) come
from a coordinator on its event loop to the caller's thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from engine.generate import CancelToken, next_turn_prefix
from engine.loading import load_model_sync
from engine.types import ChatRequest, Chunk, DoneChunk, ErrorChunk, Message, TextChunk
from exo_tui.chat.backend import ClusterBackend, LocalBackend
from exo_tui.chat.tools import ToolRegistry
from exo_tui.chat.turn import chat_turn
from exo_tui.cluster.errors import ClusterError
from exo_tui.hub.catalogue import entry_card, load_catalogue

REQUEST = ChatRequest(messages=(Message(role="user", content="hi"),))


class RingGone:
    """A coordinator whose ring goes away mid-answer: its chat raises, as a lost session does."""

    def __init__(self) -> None:
        self.stopped = False

    async def chat(
        self, request: ChatRequest, cancel: CancelToken | None = None
    ) -> AsyncIterator[Chunk]:
        yield TextChunk(text="Hel")
        await asyncio.sleep(0)
        raise ClusterError("the ring is gone", "Launch the model again (Ctrl+L)")

    async def stop(self) -> None:
        self.stopped = True


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop in its own thread, as the app's and the CLI's are to the chat's thread."""
    running = asyncio.new_event_loop()
    thread = threading.Thread(target=running.run_forever, daemon=True)
    thread.start()
    yield running
    running.call_soon_threadsafe(running.stop)
    thread.join(5)
    running.close()


def test_a_failing_coordinator_ends_the_answer_with_an_error(
    loop: asyncio.AbstractEventLoop,
) -> None:
    backend = ClusterBackend(RingGone(), entry_card(load_catalogue()[0]), loop)
    chunks = list(backend.generate(REQUEST, None))
    assert chunks[0] == TextChunk(text="Hel")
    errors = [c for c in chunks if isinstance(c, ErrorChunk)]
    assert len(errors) == 1 and "the ring is gone" in errors[0].message
    assert isinstance(chunks[-1], DoneChunk) and chunks[-1].finish_reason == "error"


def test_a_turn_on_a_failing_cluster_says_why(loop: asyncio.AbstractEventLoop) -> None:
    backend = ClusterBackend(RingGone(), entry_card(load_catalogue()[0]), loop)
    events = list(chat_turn(backend, REQUEST, ToolRegistry([])))
    assert any(isinstance(e, ErrorChunk) and "ring is gone" in e.message for e in events)


def test_unload_stops_the_instance(loop: asyncio.AbstractEventLoop) -> None:
    coordinator = RingGone()
    ClusterBackend(coordinator, entry_card(load_catalogue()[0]), loop).unload()
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0.05), loop).result(5)
    assert coordinator.stopped


def test_a_prefill_asked_for_before_a_turn_is_stopped_with_it(tiny_llama: Path) -> None:
    backend = LocalBackend(load_model_sync(tiny_llama))
    loaded = backend.loaded
    history = ChatRequest(messages=(Message(role="system", content="Answer briefly."),))
    prefix = next_turn_prefix(loaded, history, "hello")
    backend.stop_prefill()  # the message was sent while its draft's prefill waited
    backend.prefill_next(history, "hello")
    assert loaded.prompt_cache.reusable(prefix) == 0
    asked = history.model_copy(
        update={"messages": (*history.messages, Message(role="user", content="hello"))}
    )
    done = list(backend.generate(asked.model_copy(update={"max_tokens": 2}), None))[-1]
    assert isinstance(done, DoneChunk)
    # After the answer, prefills are for the next turn again.
    backend.prefill_next(history, "hello")
    assert loaded.prompt_cache.reusable(prefix) == len(prefix) - 1
