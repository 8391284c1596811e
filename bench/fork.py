"""Benchmark: the first token of a chat forked at an earlier message, against a cold start.

A chat of `--turns` turns (user and assistant messages of `--words` words each; the defaults
fit the demo's 2,048 tokens) is in the prompt cache as the app leaves it after an answer (the
next-turn prefill of the whole chat). The user forks at the user message of turn `--at` (1 is
the first): the branch's prompt is the messages before it and the edited message. Through
`LocalBackend.generate` (the TUI's path, the batch engine), for each model it prints

- the fork: time to the first token with the chat forked from in the cache (only what follows
  the shared prefix is prefilled), and the tokens cached;
- a cold start of the same history: the same prompt after `forget_history()` (all prefilled);
- both, and the ratio cold / fork.

Each is the median of `--rounds` runs; before each fork run the cache is emptied and the chat
prefilled again, so every fork starts from the chat forked from, not from the last fork.

    .venv/bin/python bench/fork.py [--models demo,tiny] [--turns 8] [--at 7] [--words 40]

Models: `demo` (the bundled demo), `tiny` (a random-weight llama of about 27M parameters with
the tests' tokenizer, built into a temporary folder), `1b` (bench/batching.py's 4-bit
1B-shaped llama, built once into its cache folder).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import engine  # noqa: E402,F401  (before mlx: it preloads the system OpenBLAS)

WORDS = (
    "the model answers each question with care and the user reads it slowly before asking "
    "again about nodes layers memory tokens prompts caches rings pipelines tensors kernels "
    "threads cores weights shards downloads chats branches edits forks answers tools"
).split()


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def chat_history(turns: int, words: int) -> list[Any]:
    from engine.types import Message

    rng = random.Random(0)
    history = [Message(role="system", content="You are a helpful assistant. Answer briefly.")]
    for _ in range(turns):
        history.append(Message(role="user", content=text(rng, words)))
        history.append(Message(role="assistant", content=text(rng, words)))
    return history


def first_token_s(backend: Any, request: Any) -> tuple[float, int, int]:
    """Seconds to the first chunk of `request`'s answer, its prompt tokens and those cached."""
    started = time.perf_counter()
    first: float | None = None
    done: Any = None
    for chunk in backend.generate(request, None):
        if first is None:
            first = time.perf_counter() - started
        if chunk.type == "done":
            done = chunk
    if done is None or done.finish_reason == "error":
        raise SystemExit(f"the answer failed: {done}")
    assert first is not None
    return first, done.usage.prompt_tokens, done.usage.cached_tokens


def bench_model(name: str, folder: Path, turns: int, at: int, words: int, rounds: int) -> None:
    from engine.generate import render_prompt
    from engine.loading import load_model_sync
    from engine.types import ChatRequest, Message
    from exo_tui.chat.backend import LocalBackend

    loaded = load_model_sync(folder)
    backend = LocalBackend(loaded)
    history = chat_history(turns, words)
    position = 2 * at - 1  # the user message of turn `at`
    edited = Message(role="user", content=history[position].content + " Say it again, shorter.")
    chat = ChatRequest(messages=tuple(history), max_tokens=1)
    fork = ChatRequest(messages=(*history[:position], edited), max_tokens=1)
    print(f"\n== {name}: {loaded.card.name}, {loaded.kernels}", flush=True)

    def forked() -> tuple[float, int, int]:
        backend.forget_history()
        backend.prefill_next(chat)  # the chat as the app leaves it in the cache
        return first_token_s(backend, fork)

    def cold() -> tuple[float, int, int]:
        backend.forget_history()
        return first_token_s(backend, fork)

    forked()  # warm up
    cold()
    forks = [forked() for _ in range(rounds)]
    colds = [cold() for _ in range(rounds)]
    fork_s = statistics.median(run[0] for run in forks)
    cold_s = statistics.median(run[0] for run in colds)
    prompt, cached = forks[0][1], forks[0][2]
    print(
        f"chat of {turns} turns ({len(render_prompt(loaded, chat))} tokens), "
        f"forked at turn {at}: its prompt is {prompt} tokens"
    )
    print(f"fork:  TTFT {fork_s * 1000:8.1f} ms  ({cached} of {prompt} tokens cached)")
    print(f"cold:  TTFT {cold_s * 1000:8.1f} ms  ({colds[0][2]} cached)")
    print(f"cold / fork: {cold_s / fork_s:.1f}x", flush=True)
    backend.unload()


def tiny_model(folder: Path) -> Path:
    from tests.tiny_models import build_tiny_model

    print("building the tiny model", flush=True)
    return build_tiny_model(
        folder,
        hidden_size=512,
        num_layers=8,
        num_heads=8,
        num_kv_heads=4,
        intermediate_size=1536,
        vocab_size=768,
        max_position_embeddings=8192,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--models", default="demo,tiny", help="demo, tiny, 1b (comma-separated)")
    parser.add_argument("--turns", type=int, default=8, help="turns in the chat forked from")
    parser.add_argument("--at", type=int, default=7, help="the turn whose message is edited")
    parser.add_argument("--words", type=int, default=40, help="words in each message")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each; the median is shown")
    args = parser.parse_args()
    if not 1 <= args.at <= args.turns:
        raise SystemExit(f"--at {args.at}: fork at a turn from 1 to --turns ({args.turns})")
    from engine.models.locations import bundled_demo_dir

    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models.split(","):
            if name == "demo":
                folder = bundled_demo_dir()
            elif name == "tiny":
                folder = tiny_model(Path(scratch) / "tiny")
            elif name == "1b":
                from bench.batching import the_1b_model

                folder = the_1b_model(None)
            else:
                raise SystemExit(f"unknown model {name!r}: use demo, tiny or 1b")
            bench_model(name, folder, args.turns, args.at, args.words, args.rounds)


if __name__ == "__main__":
    main()
