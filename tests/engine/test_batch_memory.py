"""The batch and this machine's memory: a prompt whose cache could not fit is refused, a
request waits while the others' caches leave no room for its, and an answer ends (its length)
when its cache could not grow, never the machine running out of memory. The memory free is the
system's reading, set here (the one boundary stood in for); the model, its caches and the
threads are real."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.batching import MEMORY_CHECK_STEPS, BatchEngine
from engine.errors import RequestError
from engine.generate import generate
from engine.kv_memory import GROWTH, kv_bytes_per_position, margin_bytes
from engine.loading import LoadedModel, load_model_sync
from engine.types import Chunk, DoneChunk, TextChunk
from tests.engine.test_batching import alone, chat, delivered, done_of

PLENTY = 100_000  # positions of cache: more than any test's requests take


class Free:
    """The memory the system says is free: room for `positions` of the model's cache, past
    the margin the batch leaves."""

    def __init__(self, loaded: LoadedModel, positions: int) -> None:
        card = loaded.card
        self.per_position = kv_bytes_per_position(card, card.num_layers, card.num_kv_heads)
        self.positions = positions

    def __call__(self) -> int:
        return margin_bytes() + self.positions * self.per_position


@pytest.fixture(scope="module")
def loaded(tiny_llama: Path) -> LoadedModel:
    model = load_model_sync(tiny_llama)
    list(generate(model, chat("hello", max_tokens=1)))  # its prefill speed measured
    model.prompt_cache.clear()
    return model


@pytest.fixture
def room(loaded: LoadedModel) -> Iterator[tuple[Free, BatchEngine]]:
    """An engine, and the memory free it reads (room for PLENTY positions until a test says)."""
    free = Free(loaded, positions=PLENTY)
    engine = BatchEngine(loaded, max_batch=4, free_memory=free)
    yield free, engine
    engine.close()
    loaded.prompt_cache.clear()


def answers_as_alone(loaded: LoadedModel, free: Free, engine: BatchEngine) -> None:
    """With the memory back, the engine answers as ever: a request gives its tokens alone."""
    free.positions = PLENTY
    answer = list(engine.generate(chat("hello there")))
    assert done_of(answer).token_ids == done_of(alone(loaded, chat("hello there"))).token_ids


def test_a_prompt_whose_cache_could_not_fit_is_refused_at_once_and_the_next_is_answered(
    loaded: LoadedModel, room: tuple[Free, BatchEngine]
) -> None:
    free, engine = room
    free.positions = 100
    with pytest.raises(RequestError) as refused:
        engine.submit(chat("hello there"), None, lambda _: None)
    assert "this machine has free" in refused.value.cause
    assert "Shorten the conversation" in refused.value.fix
    answers_as_alone(loaded, free, engine)  # (another program let go of its memory)


def test_a_waiting_request_is_refused_when_memory_is_still_short_once_the_others_end(
    loaded: LoadedModel, room: tuple[Free, BatchEngine]
) -> None:
    free, engine = room
    got: list[queue.Queue[Chunk | Exception]] = [queue.Queue(), queue.Queue()]
    sent = threading.Event()

    def first_delivers(item: Chunk | Exception) -> None:
        if not sent.is_set():  # the second comes; then another program takes the memory
            sent.set()
            engine.submit(chat("tell me about the sea"), None, got[1].put)
            free.positions = GROWTH
        got[0].put(item)

    engine.submit(chat("hello there"), None, first_delivers)
    assert isinstance(delivered(got[0])[-1], DoneChunk)
    refusal = got[1].get(timeout=60)
    assert isinstance(refusal, RequestError)
    assert "this machine has free" in refusal.cause
    answers_as_alone(loaded, free, engine)


def test_a_request_waits_while_the_memory_free_leaves_no_room_for_its_cache(
    loaded: LoadedModel, room: tuple[Free, BatchEngine]
) -> None:
    requests = [chat("hello there"), chat("tell me about the sea")]
    free, engine = room
    got: list[queue.Queue[Chunk | Exception]] = [queue.Queue(), queue.Queue()]
    order: list[str] = []

    def second_delivers(item: Chunk | Exception) -> None:
        order.append("second")
        got[1].put(item)

    def first_delivers(item: Chunk | Exception) -> None:
        if not order:  # its cache took the memory free, but for one growth of its own
            engine.submit(requests[1], None, second_delivers)
            free.positions = GROWTH
        if isinstance(item, DoneChunk):
            free.positions = PLENTY  # its cache let go
        order.append("first done" if isinstance(item, DoneChunk) else "first")
        got[0].put(item)

    engine.submit(requests[0], None, first_delivers)
    answers = [delivered(got[0]), delivered(got[1])]
    assert order.index("second") > order.index("first done")
    assert engine.most_at_once == 1
    for request, answer in zip(requests, answers, strict=True):
        assert done_of(answer).token_ids == done_of(alone(loaded, request)).token_ids


def test_an_answer_ends_at_its_length_when_memory_runs_short_and_the_next_is_answered(
    loaded: LoadedModel, room: tuple[Free, BatchEngine]
) -> None:
    free, engine = room
    chunks: list[Chunk] = []
    for chunk in engine.generate(chat("hello there", max_tokens=1000)):
        chunks.append(chunk)
        if sum(isinstance(c, TextChunk) for c in chunks) == 5:
            free.positions = 0  # another program took the memory
    done = chunks[-1]
    assert isinstance(done, DoneChunk)
    assert done.finish_reason == "length"
    assert done.usage.completion_tokens < 5 + 2 * MEMORY_CHECK_STEPS
    answers_as_alone(loaded, free, engine)
