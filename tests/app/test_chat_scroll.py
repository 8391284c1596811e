"""A chat the user scrolled up holds its view while the answer streams, whatever lands below
(a reasoning that folds, tool cards, stats lines, content that shrinks), until the user goes
back to the end; then it follows again (issue 19, bug 8)."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.events import MouseScrollUp
from textual.pilot import Pilot
from textual.widgets import Collapsible

from engine.generate import CancelToken
from engine.types import (
    ChatRequest,
    Chunk,
    DoneChunk,
    ReasoningChunk,
    TextChunk,
    ToolCallChunk,
)
from exo_tui.app.widgets.chat import ChatPane, StatsLine
from exo_tui.app.widgets.prompt import PromptInput
from exo_tui.app.widgets.tool_card import ToolCallView
from exo_tui.chat.backend import Deliver, answer_on_a_thread
from tests.app.helpers import wait_until
from tests.app.test_app import launch, make_app
from tests.app.test_chat_widgets import SIZE, ChatApp, done, lines, start

pytestmark = pytest.mark.anyio


async def scroll_up(pilot: Pilot[None], pane: ChatPane, how: str) -> None:
    """The user scrolls the chat up: the wheel over it, or a key with the chat focused."""
    if how == "wheel":
        for _ in range(5):
            await pilot._post_mouse_events([MouseScrollUp], pane, (10, 5))  # pyright: ignore[reportPrivateUsage]
    else:
        pane.focus()
        await pilot.press(*[how] * (3 if how == "up" else 1))
    await pilot.wait_for_scheduled_animations()


async def at_the_end(pilot: Pilot[None], pane: ChatPane) -> None:
    """Wait for the view to rest at the end; if it does not, say where it rests and why."""
    try:
        await wait_until(pilot, lambda: pane.scroll_y == pane.max_scroll_y, 60)
    except AssertionError:
        raise AssertionError(
            f"the view rests at {pane.scroll_y} of {pane.max_scroll_y} (target "
            f"{pane.scroll_target_y}; anchored {pane.is_anchored}, released "
            f"{pane._anchor_released}; virtual {pane.virtual_size}, container "  # pyright: ignore[reportPrivateUsage]
            f"{pane.container_size})"
        ) from None


@pytest.mark.parametrize("how", ["pageup", "wheel", "up", "home"])
async def test_a_reasoning_folding_below_a_view_scrolled_up_leaves_it_where_it_is(
    how: str,
) -> None:
    async with ChatApp().run_test(size=(80, 24)) as pilot:
        pane, answer = await start(pilot)
        await answer.feed(ReasoningChunk(text=lines(0, 40)))
        await wait_until(pilot, lambda: pane.max_scroll_y > 40)
        await wait_until(pilot, lambda: pane.scroll_y == pane.max_scroll_y)
        await scroll_up(pilot, pane, how)
        await wait_until(pilot, lambda: pane.scroll_y < pane.max_scroll_y)
        held, before = pane.scroll_y, pane.max_scroll_y

        # The answer starts: folding the reasoning would shrink the content under the view.
        await answer.feed(TextChunk(text=lines(40, 20)))
        await wait_until(pilot, lambda: pane.max_scroll_y >= before + 20)
        await pilot.pause()
        assert pane.scroll_y == held
        reasoning = answer.query_one(Collapsible)
        assert not reasoning.collapsed  # the user may be reading it

        # Back at the end before the answer ends: it folds then, and the view stays at the end.
        pane.focus()
        await pilot.press("end")
        await wait_until(pilot, lambda: pane.scroll_y == pane.max_scroll_y)
        await answer.feed(done())
        await wait_until(pilot, lambda: reasoning.collapsed)
        await wait_until(pilot, lambda: pane.scroll_y == pane.max_scroll_y)
        assert pane.following


async def test_content_shrinking_under_a_view_scrolled_up_does_not_make_it_follow() -> None:
    async with ChatApp().run_test(size=SIZE) as pilot:
        pane, answer = await start(pilot)
        await answer.feed(TextChunk(text=lines(0, 40)))
        await wait_until(pilot, lambda: pane.max_scroll_y > 40)
        await wait_until(pilot, lambda: pane.scroll_y == pane.max_scroll_y)
        await scroll_up(pilot, pane, "up")
        await wait_until(pilot, lambda: 0 < pane.scroll_y < pane.max_scroll_y)

        # A taller terminal: the end comes up to the view, which is not the user scrolling back.
        await pilot.resize_terminal(SIZE[0], SIZE[1] + 10)
        await wait_until(pilot, lambda: pane.scroll_y == pane.max_scroll_y)
        held, before = pane.scroll_y, pane.max_scroll_y
        await answer.feed(TextChunk(text=lines(40, 10)))
        await answer.feed(done())
        await wait_until(pilot, lambda: pane.max_scroll_y >= before + 15)
        await pilot.pause()
        assert pane.scroll_y == held
        assert not pane.following

        # Back at the end, it follows again.
        pane.focus()
        await pilot.press("end")
        await wait_until(pilot, lambda: pane.scroll_y == pane.max_scroll_y)
        answer = await pane.start_answer()
        before = pane.max_scroll_y
        await answer.feed(TextChunk(text=lines(50, 10)))
        await wait_until(pilot, lambda: pane.max_scroll_y >= before + 15)
        await wait_until(pilot, lambda: pane.scroll_y == pane.max_scroll_y)


class LongAnswer:
    """The loaded model's stand-in at the backend: a long answer, a word every few
    milliseconds as a model gives them, of the kind the test sets (reasoning, then text);
    chunks put in `next` go out first (a tool call, the end). While `flowing` is clear it
    gives no words, as a model between tokens: the screen settles."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self.next: queue.Queue[Chunk] = queue.Queue()
        self.reasoning = threading.Event()
        self.reasoning.set()
        self.flowing = threading.Event()
        self.flowing.set()
        self.words = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def answer(self, request: ChatRequest, cancel: CancelToken, deliver: Deliver) -> bool:
        return answer_on_a_thread(self.generate, request, cancel, deliver)

    def generate(self, request: ChatRequest, cancel: CancelToken | None) -> Iterator[Chunk]:
        while cancel is None or not cancel.is_set():
            try:
                chunk = self.next.get_nowait()
            except queue.Empty:
                time.sleep(0.02)
                if not self.flowing.is_set():
                    continue
                self.words += 1
                text = f"word{self.words} " + ("\n\n" if self.words % 12 == 0 else "")
                yield ReasoningChunk(text=text) if self.reasoning.is_set() else TextChunk(text=text)
                continue
            yield chunk
            if isinstance(chunk, DoneChunk):
                return
        yield done("cancelled")


@pytest.mark.parametrize("how", ["pageup", "wheel"])
async def test_the_app_holds_a_chat_scrolled_up_through_a_long_tool_answer(
    models_dir: Path, how: str
) -> None:
    app = make_app(models_dir)
    async with app.run_test(size=(80, 24)) as pilot:
        await launch(app, pilot)
        model = LongAnswer(app.conversation.backend)
        app.conversation.backend = model  # type: ignore[assignment]
        # Text paced by the interval alone (as where no thread's CPU clock can be read): the
        # screen's own load, the test's looking included, does not hold the words back.
        app.conversation._screen_cpu = lambda: None  # pyright: ignore[reportPrivateUsage]
        await pilot.click(PromptInput)
        await pilot.press(*"Hi", "enter")
        pane = app.query_one(ChatPane)
        await wait_until(pilot, lambda: pane.max_scroll_y > 30, 60)
        assert pane.scroll_y == pane.max_scroll_y
        await scroll_up(pilot, pane, how)
        held = pane.scroll_y
        assert held < pane.max_scroll_y

        def grown() -> Callable[[], bool]:
            before = pane.max_scroll_y
            return lambda: pane.max_scroll_y > before

        model.reasoning.clear()  # the answer's text starts below the reasoning
        await wait_until(pilot, grown(), 60)
        assert pane.scroll_y == held
        model.next.put(ToolCallChunk(id="c1", name="calculator", arguments={"expression": "2+2"}))
        model.next.put(done("tool_calls"))
        await wait_until(pilot, lambda: bool(app.query(ToolCallView) and app.query(StatsLine)), 60)
        await wait_until(pilot, grown(), 60)  # the round after the tool's result streams
        assert pane.scroll_y == held

        # Back at the end, the view follows the words again. It is looked at between words,
        # where nothing is left to lay out: the check does not race the next word's layout.
        pane.focus()
        await pilot.press("end")
        model.flowing.clear()
        await at_the_end(pilot, pane)
        model.flowing.set()
        await wait_until(pilot, grown(), 60)
        model.flowing.clear()
        await at_the_end(pilot, pane)
        model.next.put(done())
        await wait_until(pilot, lambda: not app.conversation.generating, 60)


async def test_end_follows_lines_laid_out_right_after_it_without_going_back_up() -> None:
    """End jumps to the end and anchors the view: lines laid out right after it are followed at
    once. (An animated End's frames went on toward the end it started for, over the anchor's
    scroll to those lines: the view jumped down, went back up, and could rest short of the
    end, as it did in the long tool answer's test.)"""
    async with ChatApp().run_test(size=SIZE) as pilot:
        pane, answer = await start(pilot)
        await answer.feed(TextChunk(text=lines(0, 60)))
        await wait_until(pilot, lambda: pane.max_scroll_y > 40)
        pane.focus()
        await pilot.press("home")
        await wait_until(pilot, lambda: pane.scroll_y == 0)
        before = pane.max_scroll_y
        views: list[float] = []

        async def more_lines_while_watching() -> None:
            for tick in range(24):
                await asyncio.sleep(0.05)
                if tick == 5:
                    await answer.feed(TextChunk(text=lines(60, 30)))
                views.append(pane.scroll_y)

        watching = asyncio.create_task(more_lines_while_watching())
        await pilot.press("end")
        await watching
        await wait_until(pilot, lambda: pane.max_scroll_y >= before + 20)
        await wait_until(pilot, lambda: pane.scroll_y == pane.max_scroll_y)
        assert views == sorted(views), views
        assert pane.following
