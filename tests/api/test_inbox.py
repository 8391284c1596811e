"""The inbox between the model's thread and the event loop: items in order, in batches, and a
hold that gathers them without waking the loop for each."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from exo_tui.api.inbox import Inbox


def put_from_a_thread(
    inbox: Inbox[int], items: range, pause: float = 0.0, last: bool = False
) -> threading.Thread:
    def run() -> None:
        for item in items:
            inbox.put(item, last=last and item == items[-1])
            time.sleep(pause)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_items_put_from_a_thread_are_taken_in_order() -> None:
    async def main() -> list[int]:
        inbox: Inbox[int] = Inbox(asyncio.get_running_loop())
        thread = put_from_a_thread(inbox, range(2000))
        taken: list[int] = []
        while len(taken) < 2000:
            taken += await inbox.take(30)
        thread.join()
        return taken

    assert asyncio.run(main()) == list(range(2000))


def test_a_hold_gathers_what_comes_without_waking_the_loop_for_it() -> None:
    async def main() -> tuple[list[int], list[int], int, float]:
        loop = asyncio.get_running_loop()
        wakes = 0
        real: Callable[..., Any] = loop.call_soon_threadsafe

        def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal wakes
            wakes += 1
            return real(*args, **kwargs)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        inbox: Inbox[int] = Inbox(loop)
        put_from_a_thread(inbox, range(1)).join()
        first = await inbox.take(30)
        wakes = 0
        started = time.monotonic()
        hold = asyncio.ensure_future(inbox.hold(0.4))
        await asyncio.sleep(0)  # the hold is under way
        thread = put_from_a_thread(inbox, range(1, 21), pause=0.005)
        await hold
        held_for = time.monotonic() - started
        during = wakes
        thread.join()
        return first, inbox.take_ready(), during, held_for

    first, gathered, wakes, held_for = asyncio.run(main())
    assert first == [0]
    assert gathered == list(range(1, 21))
    assert wakes == 0, f"the loop was woken {wakes} times during the hold"
    assert held_for >= 0.35


def test_the_last_item_ends_a_hold_at_once() -> None:
    async def main() -> tuple[list[int], float]:
        inbox: Inbox[int] = Inbox(asyncio.get_running_loop())
        started = time.monotonic()
        thread = put_from_a_thread(inbox, range(3), pause=0.02, last=True)
        await inbox.hold(60)
        thread.join()
        return inbox.take_ready(), time.monotonic() - started

    items, held_for = asyncio.run(main())
    assert items == [0, 1, 2]
    assert held_for < 10


def test_a_take_gives_nothing_when_nothing_comes_in_time() -> None:
    async def main() -> list[int]:
        return await Inbox[int](asyncio.get_running_loop()).take(0.05)

    assert asyncio.run(main()) == []
