"""Benchmark: does the TUI keep up with the engine, and does it answer keys while streaming?

Runs the same greedy generation headless (the engine alone, the anchor) and through the running
app (`App.run_test`, a real tiny model, the real chat pane), and prints the ratio of tokens per
second of wall time from send to done (target ≥ 0.95) and the longest gap between a key press and
its effect (the key's character showing in the prompt) while the answer streams (target < 50 ms).

    .venv/bin/python bench/tui_stream.py [--model PATH] [--tokens 400] [--rounds 3]
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
from exo_tui.app.main import SYSTEM_PROMPT  # noqa: E402

PROMPT = "Tell me everything about the machines in this cluster."


def headless(loaded: LoadedModel, tokens: int) -> float:
    """Tokens per second of wall time, send to done, with nothing drawing."""
    loaded.prompt_cache.clear()
    messages = (Message(role="system", content=SYSTEM_PROMPT), Message(role="user", content=PROMPT))
    request = ChatRequest(messages=messages, max_tokens=tokens, temperature=0.0)
    started = time.perf_counter()
    done = [c for c in generate(loaded, request) if isinstance(c, DoneChunk)][0]
    return done.usage.completion_tokens / (time.perf_counter() - started)


async def through_app(model: Path, loaded: LoadedModel, tokens: int) -> tuple[float, float]:
    """Tokens per second through the app, and the longest key-to-screen gap while streaming."""
    from textual import events

    from exo_tui.app.main import ExoTuiApp
    from exo_tui.app.widgets.chat import AnswerView, PromptInput, StatsLine
    from exo_tui.tools import ToolRegistry
    from tests.app.helpers import fixed_stats

    app = ExoTuiApp(model=str(model), node_stats=fixed_stats(), bundled=False)
    app.tools = ToolRegistry([])  # no tools: the same prompt as the headless run
    app.max_tokens = tokens
    async with app.run_test(size=(120, 40)) as pilot:
        app.loaded = loaded
        loaded.prompt_cache.clear()
        prompt = app.query_one(PromptInput)
        prompt.text = PROMPT
        await pilot.pause()
        started = time.perf_counter()
        # Keys are posted as a terminal sends them; Pilot.press would wait for the app to idle.
        app.post_message(events.Key("enter", None))
        gaps: list[float] = []
        while not app.query(StatsLine):
            answers = app.query(AnswerView)
            if answers and answers.last().text:
                before = prompt.text
                pressed = time.perf_counter()
                app.post_message(events.Key("x", "x"))
                while prompt.text == before:
                    await asyncio.sleep(0.001)
                gaps.append(time.perf_counter() - pressed)
            await asyncio.sleep(0.02)
        elapsed = time.perf_counter() - started
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
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from tests.tiny_models import build_tiny_model

            model = build_tiny_model(Path(tmp) / "tiny-llama", "llama", hidden_size=256)
        loaded = load_model_sync(model)
        anchor: list[float] = []
        app: list[float] = []
        gaps: list[float] = []
        for round_ in range(args.rounds):
            anchor.append(headless(loaded, args.tokens))
            tps, gap = asyncio.run(through_app(model, loaded, args.tokens))
            app.append(tps)
            gaps.append(gap)
            print(
                f"round {round_ + 1}: headless {anchor[-1]:.0f} tok/s, app {tps:.0f} tok/s, "
                f"longest key gap {gap * 1000:.1f} ms",
                flush=True,
            )
    a, b = statistics.median(anchor), statistics.median(app)
    print()
    print(f"model {model.name}, {args.tokens} tokens, {args.rounds} rounds (medians)")
    print("| figure | headless (anchor) | through the app | ratio | target |")
    print("|---|---|---|---|---|")
    print(f"| tok/s, send to done | {a:.0f} | {b:.0f} | {b / a:.2f}x | ≥ 0.95x |")
    print(
        f"| longest key-to-screen gap while streaming | | {max(gaps) * 1000:.1f} ms | | < 50 ms |"
    )


if __name__ == "__main__":
    main()
