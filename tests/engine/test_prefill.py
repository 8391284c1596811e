"""A prefill in steps: progress before the first token, a cancel between steps, the steps sized
from the model's measured speed; on both paths (one request alone, and the batch engine).

A tiny model is fast, so a model that is slow is made by asking for steps of a millionth of a
second (`PrefillPace(step_s=...)`): each step is then one token, whatever the machine.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.batching import BatchEngine
from engine.generate import generate, render_prompt
from engine.loading import LoadedModel, load_model_sync
from engine.prefill import FIRST_STEP, MAX_STEP, PrefillPace
from engine.types import ChatRequest, Chunk, DoneChunk, Message, PrefillProgress, TextChunk

LONG = "Tell me about the pipeline and the ring. " * 5  # some 100 tokens with the template
TINY_STEP_S = 1e-6  # one token a step: no CPU prefills a million tokens a second


def chat(text: str, max_tokens: int = 4) -> ChatRequest:
    return ChatRequest(
        messages=(Message(role="user", content=text),), temperature=0.0, max_tokens=max_tokens
    )


@pytest.fixture(scope="module")
def loaded(tiny_llama: Path) -> LoadedModel:
    return load_model_sync(tiny_llama)


@pytest.fixture(scope="module")
def batch(loaded: LoadedModel) -> Iterator[BatchEngine]:
    engine = BatchEngine(loaded)
    yield engine
    engine.close()


def slow(loaded: LoadedModel) -> LoadedModel:
    """`loaded` as a model too slow for its prompt to go in one step (its speed not known yet)."""
    loaded.prompt_cache.clear()
    loaded.prefill_pace = PrefillPace(step_s=TINY_STEP_S)
    return loaded


def fast(loaded: LoadedModel) -> LoadedModel:
    """`loaded` with its speed measured, as after its first answer."""
    loaded.prompt_cache.clear()
    loaded.prefill_pace = PrefillPace()
    list(generate(loaded, chat("hello")))
    assert loaded.prefill_pace.tokens_per_s is not None
    loaded.prompt_cache.clear()
    return loaded


def progress_of(chunks: list[Chunk]) -> list[PrefillProgress]:
    return [c for c in chunks if isinstance(c, PrefillProgress)]


def assert_progress_then_tokens(chunks: list[Chunk], total: int) -> None:
    progress = progress_of(chunks)
    assert progress, "no progress reported"
    done = [p.done for p in progress]
    assert done == sorted(set(done)), done  # rising, each step further
    assert done[0] == FIRST_STEP  # a model's first step is small: its speed is not known
    assert done[-1] == total and all(p.total == total for p in progress)
    last_progress = max(i for i, c in enumerate(chunks) if isinstance(c, PrefillProgress))
    first_text = min(i for i, c in enumerate(chunks) if isinstance(c, TextChunk))
    assert last_progress < first_text


def test_the_pace_sizes_steps_from_the_measured_speed() -> None:
    pace = PrefillPace(step_s=1.0)
    assert pace.step(500) == FIRST_STEP  # not measured yet: a small step first
    assert pace.step(FIRST_STEP) == 0  # ... unless the prompt is that small
    pace.record(10, 2.0)  # 5 tokens a second
    assert pace.step(51) == 5
    assert pace.step(51, prompts=5) == 1  # five prompts share each step
    assert pace.step(4) == 0  # the rest fits in a step: the first token's pass takes it
    pace.record(1, 1.0)  # a slower reading (a short pass's fixed cost) does not lower it
    assert pace.tokens_per_s == 5
    pace.record(1_000_000, 1.0)
    assert pace.step(10_000_000) == MAX_STEP
    assert pace.at_most(64) == 64


def test_a_slow_prefill_reports_progress_up_to_all_then_the_same_tokens(
    loaded: LoadedModel,
) -> None:
    request = chat(LONG)
    total = len(render_prompt(loaded, request))
    chunks = list(generate(slow(loaded), request))
    assert_progress_then_tokens(chunks, total)
    stepped = chunks[-1]
    assert isinstance(stepped, DoneChunk) and stepped.finish_reason == "length"
    plain = list(generate(fast(loaded), request))
    assert not progress_of(plain)  # a fast model keeps its one pass
    assert isinstance(plain[-1], DoneChunk)
    assert stepped.token_ids == plain[-1].token_ids


def test_a_cancel_between_steps_ends_the_answer_and_keeps_what_was_prefilled(
    loaded: LoadedModel,
) -> None:
    request = chat(LONG)
    prompt = render_prompt(loaded, request)
    cancel = threading.Event()
    chunks: list[Chunk] = []
    for chunk in generate(slow(loaded), request, cancel):
        chunks.append(chunk)
        if isinstance(chunk, PrefillProgress):
            cancel.set()
    done = chunks[-1]
    assert isinstance(done, DoneChunk) and done.finish_reason == "cancelled"
    assert done.usage.completion_tokens == 0
    assert [type(c) for c in chunks] == [PrefillProgress, DoneChunk]
    assert loaded.prompt_cache.reusable(prompt) == FIRST_STEP
    # The next try starts where it stopped.
    again = list(generate(loaded, request))
    assert isinstance(again[-1], DoneChunk)
    assert again[-1].usage.cached_tokens == FIRST_STEP


def test_ranks_take_rank_zeros_steps(loaded: LoadedModel) -> None:
    request = chat(LONG)
    total = len(render_prompt(loaded, request))
    chunks = list(generate(slow(loaded), request, agree=lambda size: 10 if size else 0))
    # Steps of 10, but the last token is left for the pass that gives the first token.
    assert [p.done for p in progress_of(chunks)] == [*range(10, total - 1, 10), total - 1, total]
    none = list(generate(slow(loaded), request, agree=lambda size: 0))
    assert not progress_of(none)  # rank 0 saw no need: nobody steps
    shard = dataclasses.replace(slow(loaded), ranks=2)
    assert not progress_of(list(generate(shard, request)))  # ranks with no say take no steps


def test_the_batch_reports_a_slow_prefill_up_to_all_then_the_same_tokens(
    loaded: LoadedModel, batch: BatchEngine
) -> None:
    request = chat(LONG)
    total = len(render_prompt(loaded, request))
    slow(loaded)
    chunks = list(batch.generate(request))
    assert_progress_then_tokens(chunks, total)
    plain = list(generate(fast(loaded), request))
    assert isinstance(chunks[-1], DoneChunk) and isinstance(plain[-1], DoneChunk)
    assert chunks[-1].token_ids == plain[-1].token_ids
    fast(loaded)
    assert not progress_of(list(batch.generate(request)))  # a fast model keeps its one pass


class AfterRounds:
    """A cancel the batch engine sees set from its `rounds`th look on (it looks once a round,
    before each step): a cancel that lands between two known steps, whatever the timing."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds
        self.looks = 0

    def is_set(self) -> bool:
        self.looks += 1
        return self.looks >= self.rounds


def test_a_cancel_between_the_batchs_steps_keeps_what_was_prefilled(
    loaded: LoadedModel, batch: BatchEngine
) -> None:
    request = chat(LONG)
    prompt = render_prompt(loaded, request)
    slow(loaded)
    chunks = list(batch.generate(request, AfterRounds(3)))
    done = chunks[-1]
    assert isinstance(done, DoneChunk) and done.finish_reason == "cancelled"
    assert done.usage.completion_tokens == 0
    progress = progress_of(chunks)
    # The first step before it joined the batch, then one a round until the cancel.
    assert [p.done for p in progress] == [FIRST_STEP, FIRST_STEP + 1, FIRST_STEP + 2]
    assert loaded.prompt_cache.reusable(prompt) == progress[-1].done


def test_an_answer_left_unread_in_its_prefill_puts_back_what_its_cache_holds(
    loaded: LoadedModel,
) -> None:
    request = chat(LONG)
    prompt = render_prompt(loaded, request)
    measured = fast(loaded).prefill_pace
    cold = list(generate(loaded, request))[-1]
    assert isinstance(cold, DoneChunk)
    for stop_at in (FIRST_STEP, len(prompt)):  # after a step, and after the whole prefill
        chunks = generate(slow(loaded), request)
        for chunk in chunks:
            if isinstance(chunk, PrefillProgress) and chunk.done == stop_at:
                break
        chunks.close()  # the caller stops listening there
        assert loaded.prompt_cache.reusable([*prompt, 5]) == stop_at
        loaded.prefill_pace = measured
        warm = list(generate(loaded, request))[-1]  # from what was kept
        assert isinstance(warm, DoneChunk)
        assert warm.usage.cached_tokens == min(stop_at, len(prompt) - 1)
        assert warm.token_ids == cold.token_ids  # what was kept is true
