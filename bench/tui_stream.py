"""Benchmark: does the TUI keep up with the engine, and does it answer keys while streaming?

Runs the same greedy generation headless (the engine alone, the anchor) and through the running
app (`App.run_test`, a real tiny model, the real chat pane), and prints the ratio of tokens per
second of wall time from send to done (target ≥ 0.95) with a user watching the answer, and, in a
second pass with a user typing the next question (a key every 100 ms, a fast typist), the
longest gap between a key press and its effect (the character showing in the prompt; target
< 50 ms) and the tok/s ratio while typing.

    .venv/bin/python bench/tui_stream.py [--model PATH] [--tokens 400] [--rounds 3] [--warmup 1]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import engine  # noqa: E402,F401  (fast BLAS before MLX)
from engine.generate import generate  # noqa: E402
from engine.loading import LoadedModel, load_model_sync  # noqa: E402
from engine.types import ChatRequest, DoneChunk, Message  # noqa: E402
from exo_tui.app.conversation import SYSTEM_PROMPT  # noqa: E402

PROMPT = "Tell me everything about the machines in this cluster."


def headless(loaded: LoadedModel, tokens: int) -> float:
    """Tokens per second of wall time, send to done, with nothing drawing."""
    loaded.prompt_cache.clear()
    messages = (Message(role="system", content=SYSTEM_PROMPT), Message(role="user", content=PROMPT))
    request = ChatRequest(messages=messages, max_tokens=tokens, temperature=0.0)
    started = time.perf_counter()
    done = [c for c in generate(loaded, request) if isinstance(c, DoneChunk)][0]
    return done.usage.completion_tokens / (time.perf_counter() - started)


TYPING_INTERVAL_S = 0.1
DONE_SHOWN: list[float] = []  # when each answer's stats line was mounted


def _note_done_shown(_stats_line: object) -> None:
    DONE_SHOWN.append(time.perf_counter())


async def wait_for(condition, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.perf_counter() + timeout
    while not condition():
        if time.perf_counter() > deadline:
            raise TimeoutError("the app did not get there")
        await asyncio.sleep(0.005)


async def type_keys(app, prompt, gaps: list[float]) -> None:  # type: ignore[no-untyped-def]
    """Press a key every TYPING_INTERVAL_S once the answer shows text; note each key's delay."""
    from textual import events

    from exo_tui.app.widgets.chat import AnswerView

    await wait_for(
        lambda: bool(app.query(AnswerView)) and bool(app.query(AnswerView).last().text), 60
    )
    while True:
        before = prompt.text
        pressed = time.perf_counter()
        app.post_message(events.Key("x", "x"))
        while prompt.text == before:
            await asyncio.sleep(0.001)
        gaps.append(time.perf_counter() - pressed)
        await asyncio.sleep(max(0.0, TYPING_INTERVAL_S - (time.perf_counter() - pressed)))


async def through_app(
    model: Path, loaded: LoadedModel, tokens: int, typing: bool, chat_db: Path
) -> tuple[float, float]:
    """Tokens per second through the app, and the longest key-to-screen gap while streaming
    (0 when not `typing`)."""
    from textual import events

    from exo_tui.app.main import ExoTuiApp
    from exo_tui.app.widgets.chat import StatsLine
    from exo_tui.app.widgets.prompt import PromptInput
    from exo_tui.chat.backend import LocalBackend
    from exo_tui.chat.tools import ToolRegistry
    from tests.app.helpers import fixed_stats

    StatsLine.on_mount = _note_done_shown  # type: ignore[attr-defined]
    # Its chats go to the run's own folder, not the user's chat store.
    app = ExoTuiApp(model=str(model), node_stats=fixed_stats(), bundled=False, chat_db=chat_db)
    app.conversation.tools = ToolRegistry([])  # no tools: the same prompt as the headless run
    app.conversation.max_tokens = tokens
    async with app.run_test(size=(120, 40)) as pilot:
        app.conversation.backend = LocalBackend(loaded)
        loaded.prompt_cache.clear()
        prompt = app.query_one(PromptInput)
        prompt.text = PROMPT
        await pilot.pause()
        started = time.perf_counter()
        # Keys are posted as a terminal sends them; Pilot.press would wait for the app to idle.
        app.post_message(events.Key("enter", None))
        gaps: list[float] = []
        # Wait on the chat worker itself: polling the screen would add work to the app's loop.
        while not (chats := [w for w in app.workers if w.group == "chat"]):
            await asyncio.sleep(0.001)
        worker = chats[-1]
        typist = asyncio.create_task(type_keys(app, prompt, gaps)) if typing else None
        await worker.wait()
        # Done is when the answer's stats line is on screen; after that the worker goes on to
        # prefill the next turn while the user reads (not part of this answer's time).
        elapsed = DONE_SHOWN[-1] - started
        if typist is not None:
            typist.cancel()
        await wait_for(lambda: bool(app.query(StatsLine)))
        done = app.query_one(StatsLine).done
        print(
            f"  {len(gaps)} key presses while streaming; engine-side decode "
            f"{done.stats.decode_tps:.0f} tok/s, TTFT {done.stats.ttft_s * 1000:.0f} ms",
            flush=True,
        )
        return done.usage.completion_tokens / elapsed, max(gaps, default=0.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--warmup", type=int, default=1, help="rounds run first and not counted (imports, caches)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from tests.tiny_models import build_tiny_model

            model = build_tiny_model(Path(tmp) / "tiny-llama", "llama", hidden_size=256)
        loaded = load_model_sync(model)
        chat_db = Path(tmp) / "chats.sqlite3"
        anchor: list[float] = []
        watching: list[float] = []
        typing: list[float] = []
        gaps: list[float] = []
        for _ in range(args.warmup):
            headless(loaded, args.tokens)
            asyncio.run(through_app(model, loaded, args.tokens, False, chat_db))
        for round_ in range(args.rounds):
            anchor.append(headless(loaded, args.tokens))
            watching.append(asyncio.run(through_app(model, loaded, args.tokens, False, chat_db))[0])
            tps, gap = asyncio.run(through_app(model, loaded, args.tokens, True, chat_db))
            typing.append(tps)
            gaps.append(gap)
            print(
                f"round {round_ + 1}: headless {anchor[-1]:.0f} tok/s, app {watching[-1]:.0f} "
                f"tok/s ({watching[-1] / anchor[-1]:.2f}x), app while typing {tps:.0f} tok/s, "
                f"longest key gap {gap * 1000:.1f} ms",
                flush=True,
            )
    a, b, c = (statistics.median(x) for x in (anchor, watching, typing))
    # Each round runs headless then through the app back to back: the ratio of each round is
    # measured under the same load of this (shared) machine; its median is the figure.
    watching_ratio = statistics.median(w / h for w, h in zip(watching, anchor, strict=True))
    typing_ratio = statistics.median(t / h for t, h in zip(typing, anchor, strict=True))
    print()
    print(
        f"model {model.name}, {args.tokens} tokens, {args.rounds} rounds "
        "(tok/s: medians; ratio: median of the rounds' ratios)"
    )
    print("| figure | headless (anchor) | through the app | ratio | target |")
    print("|---|---|---|---|---|")
    print(
        f"| tok/s, send to done, user watching | {a:.0f} | {b:.0f} | {watching_ratio:.2f}x "
        "| ≥ 0.95x |"
    )
    print(f"| tok/s, send to done, user typing | {a:.0f} | {c:.0f} | {typing_ratio:.2f}x | |")
    print(
        f"| longest key-to-screen gap while streaming | | {max(gaps) * 1000:.1f} ms | | < 50 ms |"
    )


if __name__ == "__main__":
    main()
