"""Streamed text reaches the screen at once, then in batches paced by what the screen costs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engine.generate import CancelToken
from engine.types import ChatRequest, Chunk, DoneChunk, Stats, TextChunk, Usage
from exo_tui.app.main import ExoTuiApp
from exo_tui.app.pacing import (
    MAX_WAIT,
    SCREEN_BUDGET,
    STREAM_INTERVAL,
    RedrawPacer,
    thread_cpu_clock,
)
from exo_tui.app.widgets.chat import AnswerView
from exo_tui.chat.backend import Deliver, answer_on_a_thread
from exo_tui.hub.catalogue import entry_card, load_catalogue
from tests.app.helpers import fixed_stats, wait_until

pytestmark = pytest.mark.anyio


class ScriptedBackend:
    """A model whose chunks come when the test lets them: the app's real chat path in front."""

    card = entry_card(load_catalogue()[0])
    concurrency = 1

    def __init__(self, chat: Callable[[ChatRequest, CancelToken | None], Iterator[Chunk]]) -> None:
        self._chat = chat

    def answer(self, request: ChatRequest, cancel: CancelToken, deliver: Deliver) -> bool:
        return answer_on_a_thread(self.generate, request, cancel, deliver)

    def generate(self, request: ChatRequest, cancel: CancelToken | None) -> Iterator[Chunk]:
        return self._chat(request, cancel)

    def prefill_next(self, request: ChatRequest, draft: str = "") -> None:
        pass

    def stop_prefill(self) -> None:
        pass

    def forget_history(self) -> None:
        pass

    def unload(self) -> None:
        pass


def answer_text(app: ExoTuiApp) -> str | None:
    answers = app.query(AnswerView)
    return answers.last().text if answers else None


class ScreenCpu:
    """The screen thread's CPU clock, set by the test (the boundary the pacer reads)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds


def test_the_first_batch_goes_at_once_then_one_per_interval_when_the_screen_is_cheap() -> None:
    screen = ScreenCpu()
    pacer = RedrawPacer(screen)
    assert pacer.due(100.0)
    pacer.sent(100.0)
    assert not pacer.due(100.0 + STREAM_INTERVAL / 2)
    screen.seconds += 0.002
    assert pacer.due(100.0 + STREAM_INTERVAL)


def test_a_costly_redraw_spaces_the_next_batches_out() -> None:
    screen = ScreenCpu()
    pacer = RedrawPacer(screen)
    pacer.sent(0.0)
    screen.seconds += 0.040  # the last batch took the screen 40 ms to lay out and draw
    assert not pacer.due(STREAM_INTERVAL)
    assert not pacer.due(0.040 / SCREEN_BUDGET - 0.01)
    assert pacer.due(0.040 / SCREEN_BUDGET + 0.01)


def test_a_screen_busy_with_other_work_holds_the_words_back_no_longer_than_max_wait() -> None:
    screen = ScreenCpu()
    pacer = RedrawPacer(screen)
    pacer.sent(0.0)
    screen.seconds += MAX_WAIT * SCREEN_BUDGET * 4  # the user typing, say: busy all along
    assert not pacer.due(MAX_WAIT - 0.01)
    assert pacer.due(MAX_WAIT)


def test_without_a_cpu_clock_the_interval_alone_paces() -> None:
    pacer = RedrawPacer(None)
    pacer.sent(0.0)
    assert not pacer.due(STREAM_INTERVAL / 2)
    assert pacer.due(STREAM_INTERVAL)


def test_another_thread_reads_the_screen_threads_cpu() -> None:
    clock = thread_cpu_clock(threading.current_thread())
    assert clock is not None  # Linux
    readings: list[float] = []
    reader = threading.Thread(target=lambda: readings.append(clock()))
    reader.start()
    reader.join()
    deadline = time.thread_time() + 0.05
    while time.thread_time() < deadline:  # this thread busy for 50 ms
        pass
    reader = threading.Thread(target=lambda: readings.append(clock()))
    reader.start()
    reader.join()
    assert readings[1] - readings[0] >= 0.045


async def test_the_first_words_of_an_answer_show_before_the_next_token(tmp_path: Path) -> None:
    more = threading.Event()

    def scripted(request: ChatRequest, cancel: CancelToken | None) -> Iterator[Chunk]:
        yield TextChunk(text="Hello")
        more.wait(10)  # the next token is slow to come
        yield TextChunk(text=" there.")
        yield DoneChunk(
            finish_reason="stop",
            usage=Usage(prompt_tokens=3, completion_tokens=2),
            stats=Stats(ttft_s=0.01, prefill_tps=1.0, decode_tps=1.0, peak_memory_bytes=0),
            token_ids=(1, 2),
        )

    app = ExoTuiApp(models_dirs=[tmp_path], chat_db=tmp_path / "chats.db", node_stats=fixed_stats())
    async with app.run_test(size=(120, 40)) as pilot:
        app.conversation.backend = ScriptedBackend(scripted)
        await pilot.press("h", "i", "enter")
        try:
            await wait_until(pilot, lambda: answer_text(app) == "Hello", timeout=5)
        finally:
            more.set()
        await wait_until(pilot, lambda: answer_text(app) == "Hello there.", timeout=5)
        await wait_until(pilot, lambda: not app.conversation.generating, timeout=5)
