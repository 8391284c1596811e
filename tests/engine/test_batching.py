"""Continuous batching: concurrent requests decode together and each gets what it would alone.

Real tiny models (and the bundled demo for tool calls), real threads; every comparison is
against `engine.generate` on the same model.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from engine.batching import PREFILL_BATCH, BatchEngine, batchable
from engine.errors import ModelFormatError, RequestError
from engine.generate import generate, prepared
from engine.loading import LoadedModel, load_model_sync
from engine.models.locations import bundled_demo_dir
from engine.types import (
    ChatRequest,
    Chunk,
    DoneChunk,
    Message,
    TextChunk,
    ToolCallChunk,
)
from exo_tui.chat.tools import BUILTIN_TOOLS

QUESTIONS = ("hello there", "tell me about the sea", "a story, please", "why is the sky blue")


def chat(text: str, *history: Message, **kwargs: object) -> ChatRequest:
    fields: dict[str, object] = {"temperature": 0.0, "max_tokens": 40, **kwargs}
    return ChatRequest(messages=(*history, Message(role="user", content=text)), **fields)  # type: ignore[arg-type]


def done_of(chunks: list[Chunk]) -> DoneChunk:
    assert isinstance(chunks[-1], DoneChunk)
    assert sum(isinstance(c, DoneChunk) for c in chunks) == 1
    return chunks[-1]


def text_of(chunks: list[Chunk]) -> str:
    return "".join(c.text for c in chunks if isinstance(c, TextChunk))


def delivered(replies: queue.Queue[Chunk | Exception]) -> list[Chunk]:
    """The chunks `BatchEngine.submit` handed to `replies.put`, up to the DoneChunk."""
    chunks: list[Chunk] = []
    while not chunks or not isinstance(chunks[-1], DoneChunk):
        item = replies.get(timeout=60)
        assert not isinstance(item, Exception)
        chunks.append(item)
    return chunks


def sent_from_first(
    engine: BatchEngine, first: ChatRequest, others: list[ChatRequest]
) -> list[queue.Queue[Chunk | Exception]]:
    """Submit `first`, then `others` from its first chunk or its refusal (on the model's thread,
    so they are there before its next step). What each one is handed, `first`'s first."""
    got: list[queue.Queue[Chunk | Exception]] = [queue.Queue() for _ in range(1 + len(others))]
    sent = threading.Event()

    def first_delivers(item: Chunk | Exception) -> None:
        if not sent.is_set():
            sent.set()
            for request, replies in zip(others, got[1:], strict=True):
                engine.submit(request, None, replies.put)
        got[0].put(item)

    engine.submit(first, None, first_delivers)
    return got


def alone(loaded: LoadedModel, request: ChatRequest) -> list[Chunk]:
    """What engine.generate gives, from an empty prompt cache (which it leaves empty)."""
    loaded.prompt_cache.clear()
    chunks = list(generate(loaded, request))
    loaded.prompt_cache.clear()
    return chunks


def together(
    batch: BatchEngine, requests: list[ChatRequest], read: Callable[[int, Iterator[Chunk]], None]
) -> None:
    """Every request from a thread of its own, started at once; `read` takes each stream."""
    start = threading.Barrier(len(requests))
    failures: list[BaseException] = []

    def run(index: int) -> None:
        start.wait()
        try:
            read(index, batch.generate(requests[index]))
        except BaseException as error:  # noqa: BLE001 (re-raised in the test's thread)
            failures.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads)
    if failures:
        raise failures[0]


def all_chunks(batch: BatchEngine, requests: list[ChatRequest]) -> list[list[Chunk]]:
    results: list[list[Chunk]] = [[] for _ in requests]

    def read(index: int, stream: Iterator[Chunk]) -> None:
        results[index] = list(stream)

    together(batch, requests, read)
    return results


@pytest.fixture(scope="module")
def loaded(tiny_llama: Path) -> LoadedModel:
    model = load_model_sync(tiny_llama)
    # Its speed measured, as after its first answer (the first prompt's prefill is stepped
    # while its speed is not known: tests/engine/test_prefill.py).
    list(generate(model, chat("hello", max_tokens=1)))
    model.prompt_cache.clear()
    return model


@pytest.fixture
def batch(loaded: LoadedModel) -> Iterator[BatchEngine]:
    loaded.prompt_cache.clear()
    engine = BatchEngine(loaded, max_batch=4)
    yield engine
    engine.close()
    loaded.prompt_cache.clear()


def test_concurrent_greedy_streams_give_each_ones_tokens_alone(
    loaded: LoadedModel, batch: BatchEngine
) -> None:
    requests = [chat(q, max_tokens=24 + 8 * i) for i, q in enumerate(QUESTIONS)]
    expected = [alone(loaded, r) for r in requests]
    got = all_chunks(batch, requests)
    for mine, theirs in zip(got, expected, strict=True):
        assert done_of(mine).token_ids == done_of(theirs).token_ids
        assert text_of(mine) == text_of(theirs)
        assert done_of(mine).finish_reason == "length"
        assert done_of(mine).usage == done_of(theirs).usage
    assert batch.most_at_once >= 2  # they were decoded together, not one after another


def test_the_default_batch_decodes_more_than_the_prompts_it_prefills_together(
    loaded: LoadedModel,
) -> None:
    loaded.prompt_cache.clear()
    engine = BatchEngine(loaded)
    try:
        requests = [chat(f"{q} {n}", max_tokens=12) for n in range(3) for q in QUESTIONS]
        expected = [alone(loaded, r) for r in requests]
        # The others come during the first one's first pass: all 12 are there for its next step.
        got = [delivered(r) for r in sent_from_first(engine, requests[0], requests[1:])]
        assert [done_of(c).token_ids for c in got] == [done_of(c).token_ids for c in expected]
        assert engine.most_at_once == 12  # every row in one step
        assert engine._generator().prefill_batch_size == PREFILL_BATCH  # long prompts: 8
    finally:
        engine.close()
        loaded.prompt_cache.clear()


def test_a_cancel_mid_stream_frees_its_slot_and_the_others_finish_unchanged(
    loaded: LoadedModel,
) -> None:
    others = [chat(q, max_tokens=30) for q in QUESTIONS[1:3]]
    expected = [alone(loaded, r) for r in others]
    engine = BatchEngine(loaded, max_batch=2)
    try:
        cancel = threading.Event()
        long = engine.generate(chat(QUESTIONS[0], max_tokens=1000), cancel)
        first = next(long)  # in the batch, decoding
        assert isinstance(first, TextChunk)
        results: list[list[Chunk]] = [[], []]

        def read(index: int, stream: Iterator[Chunk]) -> None:
            results[index] = list(stream)

        # Two slots: the long answer holds one, so the second of these waits for its cancel.
        waiting = threading.Thread(target=together, args=(engine, others, read))
        waiting.start()
        cancel.set()
        rest = list(long)
        waiting.join(60)
        done = done_of([first, *rest])
        assert done.finish_reason == "cancelled" and len(done.token_ids) < 1000
        for mine, theirs in zip(results, expected, strict=True):
            assert done_of(mine).token_ids == done_of(theirs).token_ids
    finally:
        engine.close()


def test_a_cancelled_reader_gets_nothing_decoded_ahead_of_it(
    loaded: LoadedModel, batch: BatchEngine
) -> None:
    """Chunks the model made while the reader was away (a slow screen, a tool running) are not
    handed over once it cancels: its answer ends where it stopped reading, cancelled."""
    cancel = threading.Event()
    stream = batch.generate(chat(QUESTIONS[0], max_tokens=30), cancel)
    first = next(stream)
    assert isinstance(first, TextChunk)
    time.sleep(0.5)  # the model decodes ahead of the reader (the whole answer, at this size)
    cancel.set()
    rest = list(stream)
    assert not [c for c in rest if isinstance(c, TextChunk | ToolCallChunk)]
    assert done_of([first, *rest]).finish_reason == "cancelled"


def test_delivered_chunks_are_what_the_stream_gives(
    loaded: LoadedModel, batch: BatchEngine
) -> None:
    """`submit` hands the chunks over on the model's thread, the same ones `generate` yields."""
    request = chat(QUESTIONS[1], max_tokens=12)
    expected = list(batch.generate(request))
    got: queue.Queue[Chunk | Exception] = queue.Queue()
    batch.submit(request, None, got.put)
    delivered: list[Chunk | Exception] = []
    while not delivered or not isinstance(delivered[-1], DoneChunk | Exception):
        delivered.append(got.get(timeout=60))
    assert [type(c) for c in delivered] == [type(c) for c in expected]
    assert done_of(delivered).token_ids == done_of(expected).token_ids  # type: ignore[arg-type]


def test_a_stream_closed_by_its_reader_frees_its_slot(loaded: LoadedModel) -> None:
    engine = BatchEngine(loaded, max_batch=1)
    try:
        stream = engine.generate(chat(QUESTIONS[0], max_tokens=1000))
        next(stream)
        stream.close()  # the reader went away (a client that disconnects)
        # The only slot is free again: the next request is answered, and as alone.
        after = list(engine.generate(chat(QUESTIONS[1], max_tokens=12)))
        assert (
            done_of(after).token_ids
            == done_of(alone(loaded, chat(QUESTIONS[1], max_tokens=12))).token_ids
        )
    finally:
        engine.close()


def test_a_stop_string_ends_the_answer_before_it(loaded: LoadedModel, batch: BatchEngine) -> None:
    full = text_of(alone(loaded, chat(QUESTIONS[0])))
    stop = full[12:15]
    assert len(stop) == 3 and stop in full
    before = full[: full.index(stop)]
    request = chat(QUESTIONS[0], stop=(stop, "never seen"))
    for chunks in (alone(loaded, request), all_chunks(batch, [request, chat(QUESTIONS[1])])[0]):
        assert text_of(chunks) == before
        done = done_of(chunks)
        assert done.finish_reason == "stop" and len(done.token_ids) < 40


def test_a_bad_request_among_good_ones_errors_alone(
    loaded: LoadedModel, batch: BatchEngine
) -> None:
    good = [chat(q, max_tokens=20) for q in QUESTIONS[:3]]
    expected = [alone(loaded, r) for r in good]
    empty = chat("   ")
    too_long = chat("word " * 3000)
    requests = [good[0], empty, good[1], too_long, good[2]]
    results: dict[int, list[Chunk] | RequestError] = {}

    def read(index: int, stream: Iterator[Chunk]) -> None:
        try:
            results[index] = list(stream)
        except RequestError as error:
            results[index] = error

    together(batch, requests, read)
    assert isinstance(results[1], RequestError) and "empty" in str(results[1])
    assert isinstance(results[3], RequestError) and "holds at most" in str(results[3])
    for index, theirs in zip((0, 2, 4), expected, strict=True):
        mine = results[index]
        assert isinstance(mine, list)
        assert done_of(mine).token_ids == done_of(theirs).token_ids


def test_the_next_turn_takes_the_cache_the_first_kept(
    loaded: LoadedModel, batch: BatchEngine
) -> None:
    first = chat(QUESTIONS[0], max_tokens=12)
    answer = all_chunks(batch, [first])[0]
    done = done_of(answer)
    assert done.usage.cached_tokens == 0
    history = (*first.messages, Message(role="assistant", content=text_of(answer)))
    second = chat("and then?", *history, max_tokens=12)
    again = done_of(all_chunks(batch, [second])[0])
    # The first turn's prompt at least comes from the cache: only the new part is prefilled.
    assert again.usage.cached_tokens >= done.usage.prompt_tokens
    assert again.usage.cached_tokens < again.usage.prompt_tokens


def test_a_seeded_request_samples_the_same_alone_and_in_a_batch(
    loaded: LoadedModel, batch: BatchEngine
) -> None:
    seeded = chat(QUESTIONS[0], temperature=0.9, seed=7, max_tokens=30)
    expected = done_of(alone(loaded, seeded)).token_ids
    other_seed = done_of(alone(loaded, seeded.model_copy(update={"seed": 8}))).token_ids
    assert expected != other_seed  # sampled, not greedy
    requests = [
        chat(QUESTIONS[1]),
        seeded,
        chat(QUESTIONS[2], temperature=0.9, seed=8),
        chat(QUESTIONS[3], temperature=0.9),
    ]
    got = all_chunks(batch, requests)
    assert done_of(got[1]).token_ids == expected


def test_a_request_cancelled_while_it_waits_for_a_slot_ends_cancelled(
    loaded: LoadedModel,
) -> None:
    engine = BatchEngine(loaded, max_batch=1)
    try:
        busy = engine.generate(chat(QUESTIONS[0], max_tokens=1000))
        next(busy)
        cancel = threading.Event()
        cancel.set()
        done = done_of(list(engine.generate(chat(QUESTIONS[1]), cancel)))
        assert done.finish_reason == "cancelled" and done.token_ids == ()
        busy.close()
    finally:
        engine.close()


def test_closing_ends_every_request_cancelled(loaded: LoadedModel) -> None:
    engine = BatchEngine(loaded, max_batch=2)
    stream = engine.generate(chat(QUESTIONS[0], max_tokens=1000))
    next(stream)
    closer = threading.Thread(target=engine.close)
    closer.start()
    assert done_of([*stream]).finish_reason == "cancelled"
    closer.join(30)
    assert not closer.is_alive()


def test_the_demo_calls_the_calculator_in_a_batch() -> None:
    demo = load_model_sync(bundled_demo_dir())
    question = ChatRequest(
        messages=(Message(role="user", content="what is 12 times 34"),),
        tools=BUILTIN_TOOLS,
        max_tokens=96,
        temperature=0.0,
    )
    others = [
        question.model_copy(update={"messages": (Message(role="user", content=q),)})
        for q in QUESTIONS[:2]
    ]
    expected = alone(demo, question)
    engine = BatchEngine(demo, max_batch=4)
    try:
        got = all_chunks(engine, [others[0], question, others[1]])
    finally:
        engine.close()
    calls = [c for c in got[1] if isinstance(c, ToolCallChunk)]
    assert len(calls) == 1 and calls[0].name == "calculator"
    assert "12" in calls[0].arguments["expression"] and "34" in calls[0].arguments["expression"]
    assert done_of(got[1]).finish_reason == "tool_calls"
    assert done_of(got[1]).token_ids == done_of(expected).token_ids
    theirs = [c for c in expected if isinstance(c, ToolCallChunk)]
    assert calls[0].arguments == theirs[0].arguments


def test_a_cached_chat_decoded_beside_new_ones_gives_its_tokens_alone(
    loaded: LoadedModel, batch: BatchEngine
) -> None:
    """Histories of different lengths in one batch: its caches are padded to line up."""
    first = chat(QUESTIONS[0], max_tokens=16)
    answer = text_of(all_chunks(batch, [first])[0])
    second = chat("and then?", *first.messages, Message(role="assistant", content=answer))
    fresh = [chat(q, max_tokens=30) for q in QUESTIONS[1:3]]
    expected = [alone(loaded, r) for r in (second, *fresh)]
    all_chunks(batch, [first])  # the first turn's cache is back in the store
    got = all_chunks(batch, [second, *fresh])
    assert done_of(got[0]).usage.cached_tokens > 0
    for mine, theirs in zip(got, expected, strict=True):
        assert done_of(mine).token_ids == done_of(theirs).token_ids


def test_requests_for_a_cached_prompt_start_together_with_its_tokens_alone(
    loaded: LoadedModel, batch: BatchEngine
) -> None:
    """Clients that send the same prompt at once: each continues the cached prompt (one token
    left to feed, fed for all of them in one pass of the batch) to what it gives alone. (An
    answer longer than the prompt is copied for each, not taken: engine.prompt_cache.)"""
    request = chat(QUESTIONS[1], max_tokens=20)
    expected = alone(loaded, request)
    all_chunks(batch, [chat(QUESTIONS[1], max_tokens=40)])  # the prompt and an answer are cached
    got = all_chunks(batch, [request] * 4)
    for mine in got:
        assert done_of(mine).token_ids == done_of(expected).token_ids
        assert done_of(mine).usage.cached_tokens == done_of(mine).usage.prompt_tokens - 1
    assert batch.most_at_once >= 2


def test_requests_that_come_during_a_first_pass_start_with_it_in_one_step(
    loaded: LoadedModel, batch: BatchEngine
) -> None:
    """Requests sent while the first one's prompt goes through the model (here: from its
    first chunk, which the model's thread hands over) join before the batch's first step. Their
    prompt is cached, as when clients send the same one, so that step decodes all of them: the
    first one's second token, also its last, and the others' first tokens. Joining a step
    later, they would have come after the first had ended."""
    first = chat(QUESTIONS[0], max_tokens=2)
    others = [chat(QUESTIONS[1], max_tokens=12)] * 2
    expected = [alone(loaded, r) for r in (first, *others)]
    all_chunks(batch, [chat(QUESTIONS[1], max_tokens=40)])  # the others' prompt is cached
    got = sent_from_first(batch, first, others)
    for replies, theirs in zip(got, expected, strict=True):
        assert done_of(delivered(replies)).token_ids == done_of(theirs).token_ids
    assert batch.most_at_once == 3


class CountedPasses:
    """The model, with the shape of each pass through it kept (rows, tokens)."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self.passes: list[tuple[int, int]] = []

    def __call__(self, inputs: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        self.passes.append((inputs.shape[0], inputs.shape[1]))
        return self._model(inputs, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def test_a_request_joining_decoding_rows_takes_only_its_first_pass_alone(
    loaded: LoadedModel,
) -> None:
    """A request that comes while others decode gets its first token from a pass of its own
    over its prompt; its second comes from the batch's next step, with the others' tokens, not
    from a second pass of its own (a whole pass over the weights for one row)."""
    requests = [chat(QUESTIONS[0], max_tokens=30), chat(QUESTIONS[2], max_tokens=12)]
    expected = [alone(loaded, r) for r in requests]
    counted = CountedPasses(loaded.model)
    engine = BatchEngine(dataclasses.replace(loaded, model=counted), max_batch=4)
    got: list[queue.Queue[Chunk | Exception]] = [queue.Queue(), queue.Queue()]
    try:
        seen = 0

        def first_delivers(chunk: Chunk | Exception) -> None:
            nonlocal seen
            seen += 1
            if seen == 3:  # the first is decoding in the batch: the second comes now
                engine.submit(requests[1], None, got[1].put)
            got[0].put(chunk)

        engine.submit(requests[0], None, first_delivers)
        for replies, theirs in zip(got, expected, strict=True):
            mine = delivered(replies)
            assert done_of(mine).token_ids == done_of(theirs).token_ids
            assert done_of(mine).usage == done_of(theirs).usage
    finally:
        engine.close()
    prompts = [i for i, (_, tokens) in enumerate(counted.passes) if tokens > 1]
    assert len(prompts) == 2  # each request's prompt, in one pass
    joined = prompts[1]
    assert counted.passes[joined][0] == 1
    assert counted.passes[joined + 1] == (2, 1)  # its second token, in a step of both


def test_requests_that_come_together_get_their_first_tokens_from_one_pass(
    loaded: LoadedModel,
) -> None:
    """Requests that reach the model's thread together (sent while another one's first pass
    runs), with prompts of different lengths and none cached: one pass over all their prompts,
    padded to the longest, gives each its first token, and the next step decodes them with
    the one before. Each gives the tokens it gives alone. One that ends with its first token
    (a length of one) leaves at once, its prompt's cache kept."""
    first = chat(QUESTIONS[0], max_tokens=8)
    others = [
        chat(QUESTIONS[1], max_tokens=12),
        chat(QUESTIONS[3] + ", and why at night it is dark", max_tokens=10),
        chat(QUESTIONS[2], max_tokens=1),
    ]
    expected = [alone(loaded, r) for r in (first, *others)]
    loaded.prompt_cache.clear()
    counted = CountedPasses(loaded.model)
    engine = BatchEngine(dataclasses.replace(loaded, model=counted), max_batch=4)
    try:
        answers = [delivered(replies) for replies in sent_from_first(engine, first, others)]
    finally:
        engine.close()
    for mine, theirs in zip(answers, expected, strict=True):
        assert done_of(mine).token_ids == done_of(theirs).token_ids
        assert done_of(mine).usage == done_of(theirs).usage
    lengths = [done_of(theirs).usage.prompt_tokens for theirs in expected]
    assert len(set(lengths[1:])) == 3  # padded to the longest
    assert counted.passes[:3] == [(1, lengths[0]), (3, max(lengths[1:])), (3, 1)]
    ended, _ = prepared(loaded, others[2])  # its row's cache, taken out of the group's
    assert loaded.prompt_cache.reusable(ended) == len(ended) - 1


class RecordedEvals:
    """mlx.core as engine.batching sees it, each `eval` noted in `events` before it runs."""

    def __init__(self, events: list[str]) -> None:
        self._events = events

    def eval(self, *arrays: Any) -> None:
        self._events.append("eval")
        mx.eval(*arrays)

    def __getattr__(self, name: str) -> Any:
        return getattr(mx, name)


def test_requests_that_end_at_one_step_all_get_their_ends_before_any_cache_is_computed(
    loaded: LoadedModel, batch: BatchEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Computing a finished request's cache waits for the step the batch has already begun:
    every request that ended at a step gets its end first."""
    events: list[str] = []
    monkeypatch.setattr("engine.batching.mx", RecordedEvals(events))
    requests = [chat(q, max_tokens=6) for q in QUESTIONS]
    got: list[queue.Queue[Chunk | Exception]] = [queue.Queue() for _ in requests]
    sent = threading.Event()

    def noted(index: int) -> Callable[[Chunk | Exception], None]:
        def deliver(item: Chunk | Exception) -> None:
            if index == 0 and not sent.is_set():  # the first one's first chunk: send the rest
                sent.set()
                for other in range(1, len(requests)):
                    batch.submit(requests[other], None, noted(other))
            if isinstance(item, DoneChunk):
                events.append(f"done {index}")
            got[index].put(item)

        return deliver

    batch.submit(requests[0], None, noted(0))
    answers = [delivered(replies) for replies in got]
    assert [len(done_of(a).token_ids) for a in answers] == [6, 6, 6, 6]
    # The last three joined together and ended at one step: their ends, then one eval.
    last = [e for e in events if e.startswith("done")][-3:]
    at = events.index(last[0])
    assert events[at : at + 4] == [*last, "eval"], events


def test_every_architecture_batches_to_the_tokens_it_gives_alone(tiny_model: Path) -> None:
    model = load_model_sync(tiny_model)
    assert batchable(model)
    requests = [chat(q, max_tokens=12 + 6 * i) for i, q in enumerate(QUESTIONS[:3])]
    expected = [alone(model, r) for r in requests]
    engine = BatchEngine(model, max_batch=4)
    try:
        got = all_chunks(engine, requests)
    finally:
        engine.close()
    for mine, theirs in zip(got, expected, strict=True):
        assert done_of(mine).token_ids == done_of(theirs).token_ids


def test_weights_that_are_not_numbers_are_said_to_the_caller(tiny_llama: Path) -> None:
    broken = load_model_sync(tiny_llama)
    norm = broken.model.model.norm  # type: ignore[union-attr]
    norm.weight = mx.full(norm.weight.shape, float("nan"))
    mx.eval(norm.weight)  # computed here: the model's thread cannot compute this thread's arrays
    engine = BatchEngine(broken, max_batch=2)
    try:
        # A short prompt goes through the model with its first token, a long one through the
        # batch's own prefill: both are checked.
        for text in (QUESTIONS[0], "word " * 300):
            with pytest.raises(ModelFormatError, match="NaN or infinite logits"):
                list(engine.generate(chat(text)))
        # Requests that come together get their first tokens from one pass: each is checked.
        got = sent_from_first(engine, chat(QUESTIONS[0]), [chat(q) for q in QUESTIONS[1:3]])
        for replies in got:
            refusal = replies.get(timeout=60)
            assert isinstance(refusal, ModelFormatError), refusal
            assert "NaN or infinite logits" in refusal.cause
    finally:
        engine.close()


class SetAfter:
    """A cancel set after its first `checks` looks: the engine looks once a round (a step)."""

    def __init__(self, checks: int) -> None:
        self._left = checks

    def is_set(self) -> bool:
        self._left -= 1
        return self._left < 0


def test_a_long_prompt_cancelled_while_it_prefills_keeps_what_went_through(
    loaded: LoadedModel, batch: BatchEngine
) -> None:
    long = chat("word " * 300, max_tokens=8)  # past the one pass: the batch prefills it
    done = done_of(list(batch.generate(long, SetAfter(1))))
    assert done.finish_reason == "cancelled" and done.token_ids == ()
    again = done_of(list(batch.generate(long)))
    assert again.finish_reason == "length"
    # What the cancelled one prefilled came back to the store: only its last token is new.
    assert again.usage.cached_tokens == again.usage.prompt_tokens - 1
