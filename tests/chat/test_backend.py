"""The backends: a local model's prefills stop with a turn; a cluster's chunks (and errors) come
from a coordinator on its event loop to the caller's thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from engine.answer import failure_chunks
from engine.batching import DEFAULT_BATCH
from engine.errors import EngineError
from engine.generate import CancelToken, generate, next_turn_prefix
from engine.loading import load_model_sync
from engine.prefill import PrefillPace
from engine.types import (
    ChatRequest,
    Chunk,
    DoneChunk,
    ErrorChunk,
    Message,
    PrefillProgress,
    TextChunk,
)
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


class RanksRefuse:
    """A coordinator whose ranks refuse the request (their EngineError comes as chunks) and
    take a moment to say they are done, as a real one's do."""

    def __init__(self) -> None:
        self.finished = False
        self.cancelled = False

    async def chat(
        self, request: ChatRequest, cancel: CancelToken | None = None
    ) -> AsyncIterator[Chunk]:
        for chunk in failure_chunks("Prompt is 6000 tokens; the context is 2048", refused=True):
            yield chunk
        while cancel is not None and not cancel.is_set():
            await asyncio.sleep(0.01)
        self.cancelled = True
        await asyncio.sleep(0.2)  # the ranks' ChatFinished is on its way
        self.finished = True

    async def stop(self) -> None:
        pass


def test_a_refusal_by_the_ranks_raises_after_they_finish(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Raised as in one process (the API gives 400), and only once the ranks are done with it:
    the next request must not meet this one's frames."""
    coordinator = RanksRefuse()
    backend = ClusterBackend(coordinator, entry_card(load_catalogue()[0]), loop)
    with pytest.raises(EngineError, match="context is 2048"):
        list(backend.generate(REQUEST, None))
    assert coordinator.cancelled and coordinator.finished


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


def asked(text: str, max_tokens: int) -> ChatRequest:
    return ChatRequest(
        messages=(Message(role="user", content=text),), temperature=0.0, max_tokens=max_tokens
    )


def test_a_local_model_answers_concurrent_requests_together(tiny_llama: Path) -> None:
    loaded = load_model_sync(tiny_llama)
    requests = [asked(text, 20 + 4 * i) for i, text in enumerate(("hi", "the sea", "a story"))]
    expected = []
    for request in requests:
        expected.append([c for c in generate(loaded, request)][-1])
        loaded.prompt_cache.clear()
    backend = LocalBackend(loaded)
    assert backend.concurrency == DEFAULT_BATCH
    got: list[Chunk | None] = [None] * len(requests)

    def answer(index: int) -> None:
        got[index] = list(backend.generate(requests[index], None))[-1]

    threads = [threading.Thread(target=answer, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for mine, theirs in zip(got, expected, strict=True):
        assert isinstance(mine, DoneChunk) and isinstance(theirs, DoneChunk)
        assert mine.token_ids == theirs.token_ids
    backend.unload()


def test_one_at_a_time_when_asked_to(tiny_llama: Path) -> None:
    backend = LocalBackend(load_model_sync(tiny_llama), max_batch=1)
    assert backend.concurrency == 1
    done = list(backend.generate(asked("hi", 4), None))[-1]
    assert isinstance(done, DoneChunk) and len(done.token_ids) == 4


def test_a_prefill_asked_during_an_answer_runs_after_it(tiny_llama: Path) -> None:
    loaded = load_model_sync(tiny_llama)
    request = asked("hello", 40)
    expected = [c for c in generate(loaded, request)][-1]
    loaded.prompt_cache.clear()
    backend = LocalBackend(loaded)
    history = ChatRequest(messages=(Message(role="system", content="Answer briefly."),))
    prefix = next_turn_prefix(loaded, history, "the next one")
    stream = backend.generate(request, None)
    first = next(stream)
    prefilling = threading.Thread(target=backend.prefill_next, args=(history, "the next one"))
    prefilling.start()
    done = [first, *stream][-1]
    prefilling.join(60)
    assert not prefilling.is_alive()
    assert isinstance(done, DoneChunk) and isinstance(expected, DoneChunk)
    assert done.token_ids == expected.token_ids  # the answer went on undisturbed
    assert loaded.prompt_cache.reusable(prefix) == len(prefix) - 1  # and then it ran
    backend.unload()


def test_after_an_unload_a_request_gets_an_error(tiny_llama: Path) -> None:
    backend = LocalBackend(load_model_sync(tiny_llama))
    backend.unload()
    chunks = list(backend.generate(asked("hi", 4), None))
    assert isinstance(chunks[0], ErrorChunk) and "unloaded" in chunks[0].message
    assert isinstance(chunks[-1], DoneChunk) and chunks[-1].finish_reason == "error"


def test_a_turn_passes_the_prefills_progress_on(tiny_llama: Path) -> None:
    loaded = load_model_sync(tiny_llama)
    loaded.prefill_pace = PrefillPace(step_s=1e-6)  # too slow for one step: one token a step
    backend = LocalBackend(loaded)
    try:
        request = ChatRequest(
            messages=(Message(role="user", content="Tell me about the sea. " * 10),),
            temperature=0.0,
            max_tokens=3,
        )
        events = list(chat_turn(backend, request, ToolRegistry([])))
    finally:
        backend.unload()
    progress = [e for e in events if isinstance(e, PrefillProgress)]
    assert progress and progress[-1].done == progress[-1].total
    assert events.index(progress[-1]) < next(
        i for i, e in enumerate(events) if isinstance(e, TextChunk)
    )
