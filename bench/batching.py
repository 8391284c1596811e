"""Benchmark: continuous batching, 1, 2, 4 and 8 concurrent greedy streams on one loaded model.

For the bundled demo model and a 4-bit random-weight llama of Llama-3.2-1B's shape (the model
bench/cpu_kernels.py builds, built here if its cache folder lacks it; `--num-layers` makes a
shallower one, quicker to build), prints

- one stream through `engine.generate` alone (the one-request-at-a-time path),
- N streams through `engine.batching.BatchEngine`, started together, each with its own prompt:
  aggregate tok/s (every stream's tokens over the wall time, prefill included), the ratio to one
  batched stream, each stream's time to first token, p50 and p95, and the decode alone (the
  tokens after each stream's first over the time after the last stream's first token),
- one batched stream against `engine.generate` alone,
- the 4-bit GEMV kernel on the model's widest weight for 1 and 8 rows of x: a batch of 8 reads
  each weight once a step when 8 rows cost far less than 8 times one.

The prompt cache is emptied before each run, so every run prefills its prompts. The model's
end-of-turn tokens are not honoured here, so every stream decodes `--tokens` tokens (the demo
answers most questions in a few tokens, which would leave little to decode).

    .venv/bin/python bench/batching.py [--models demo,1b] [--tokens 64] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import engine  # noqa: E402,F401  (before mlx: it preloads the system OpenBLAS)

STREAMS = (1, 2, 4, 8)
QUESTIONS = (
    "hello there, how are you today",
    "tell me a story about a cat",
    "what is the capital of france",
    "write a short poem about the sea",
    "explain how a bicycle works",
    "what should I cook for dinner",
    "describe a walk in the forest",
    "why is the sky blue",
)


def request(question: str, tokens: int) -> Any:
    from engine.types import ChatRequest, Message

    return ChatRequest(
        messages=(Message(role="user", content=question),), temperature=0.0, max_tokens=tokens
    )


def one_alone(loaded: Any, tokens: int) -> tuple[float, float, int]:
    """engine.generate for one request: (tok/s over the wall time, TTFT, tokens)."""
    from engine.generate import generate

    loaded.prompt_cache.clear()
    started = time.perf_counter()
    done: Any = None
    for chunk in generate(loaded, request(QUESTIONS[0], tokens)):
        done = chunk
    wall = time.perf_counter() - started
    count = len(done.token_ids)
    return count / wall, done.stats.ttft_s, count


def streams_together(batch: Any, count: int, tokens: int) -> tuple[float, list[float], int, float]:
    """`count` streams started at once: (aggregate tok/s, each stream's TTFT, tokens, decode
    tok/s: the tokens after each stream's first over the time after the last first token)."""
    batch.loaded.prompt_cache.clear()
    ready = threading.Barrier(count + 1)
    ttfts: list[float] = [0.0] * count
    made: list[int] = [0] * count

    def stream(index: int) -> None:
        ready.wait()
        for chunk in batch.generate(request(QUESTIONS[index % len(QUESTIONS)], tokens)):
            if chunk.type == "done":  # its first token, not its first chunk: text may be held
                ttfts[index] = chunk.stats.ttft_s
                made[index] = len(chunk.token_ids)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    ready.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    decoding = wall - max(ttfts)
    return sum(made) / wall, ttfts, sum(made), (sum(made) - count) / max(decoding, 1e-9)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def gemv_rows(loaded: Any) -> tuple[float, float] | None:
    """Seconds for the widest quantized weight times 1 and 8 rows of x (None: not 4-bit)."""
    import mlx.core as mx
    import mlx.nn as nn

    from engine import kernels

    if not kernels.available():
        return None
    widest: Any = None
    for _, layer in loaded.model.named_modules():
        if isinstance(layer, nn.QuantizedLinear) and (
            widest is None or layer["weight"].size > widest["weight"].size
        ):
            widest = layer
    if widest is None:
        return None
    k = widest["weight"].shape[1] * 32 // widest.bits
    timings: list[float] = []
    for rows in (1, 8):
        x = mx.random.normal((rows, k)).astype(mx.bfloat16)
        mx.eval(x)
        best = float("inf")
        for _ in range(20):
            started = time.perf_counter()
            mx.eval(widest(x))
            best = min(best, time.perf_counter() - started)
        timings.append(best)
    return timings[0], timings[1]


def the_1b_model(num_layers: int | None) -> Path:
    """The 4-bit 1B-shaped llama of bench/cpu_kernels.py, built into its cache folder if absent."""
    from bench import cpu_kernels

    shape = dict(cpu_kernels.LLAMA_1B)
    if num_layers is not None:
        shape["num_layers"] = num_layers
    target = cpu_kernels.paths(cpu_kernels.cache_folder(shape))
    for kind in ("bf16", "q4"):
        if target[kind].exists():
            continue
        print(f"building {target[kind]} (once)", flush=True)
        target[kind].parent.mkdir(parents=True, exist_ok=True)
        partial = target[kind].with_name(target[kind].name + ".partial")
        if kind == "bf16":
            cpu_kernels.build_mlx_bf16(partial, shape)
        else:
            cpu_kernels.build_mlx_q4(target["bf16"], partial)
        partial.rename(target[kind])
    return target["q4"]


def bench_model(name: str, folder: Path, tokens: int, rounds: int) -> None:
    from engine.batching import BatchEngine
    from engine.loading import load_model_sync

    loaded = load_model_sync(folder)
    tokenizer: Any = loaded.tokenizer
    tokenizer.eos_token_ids = []  # every stream decodes `tokens` tokens
    print(
        f"\n== {name}: {loaded.card.name}, {loaded.kernels}, {tokens} tokens a stream", flush=True
    )
    one_alone(loaded, 4)  # warm up
    alone = max(one_alone(loaded, tokens) for _ in range(rounds))
    print(f"engine.generate alone: {alone[0]:.1f} tok/s, TTFT {alone[1] * 1000:.0f} ms", flush=True)
    batch = BatchEngine(loaded, max_batch=max(STREAMS))
    streams_together(batch, 2, 4)  # warm up
    rows: list[tuple[int, float, list[float], int, float]] = []
    for count in STREAMS:
        runs = [streams_together(batch, count, tokens) for _ in range(rounds)]
        best = max(runs, key=lambda run: run[0])
        rows.append((count, *best))
    batch.close()
    single, single_decode = rows[0][1], rows[0][4]
    print(
        f"{'streams':>7} {'tok/s':>8} {'x one':>6} {'TTFT p50':>9} {'TTFT p95':>9} {'tokens':>6}"
        f" {'decode tok/s':>12} {'x one':>6}"
    )
    for count, rate, ttfts, made, decode in rows:
        print(
            f"{count:>7} {rate:>8.1f} {rate / single:>6.2f} "
            f"{statistics.median(ttfts) * 1000:>7.0f}ms {percentile(ttfts, 0.95) * 1000:>7.0f}ms "
            f"{made:>6} {decode:>12.1f} {decode / single_decode:>6.2f}"
        )
    print(f"one batched stream / engine.generate alone: {single / alone[0]:.2f}x", flush=True)
    timing = gemv_rows(loaded)
    if timing is not None:
        one, eight = timing
        print(
            f"widest 4-bit weight: 1 row {one * 1e6:.0f} us, 8 rows {eight * 1e6:.0f} us "
            f"({eight / one:.2f}x one row; 8x would read the weight once a row)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--models", default="demo,1b", help="demo, 1b or both (comma-separated)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens each stream decodes")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each; the best is shown")
    parser.add_argument("--num-layers", type=int, default=None, help="a shallower 1B model")
    args = parser.parse_args()
    from engine.models.locations import bundled_demo_dir

    for name in args.models.split(","):
        if name == "demo":
            bench_model("demo", bundled_demo_dir(), args.tokens, args.rounds)
        elif name == "1b":
            bench_model("1b 4-bit", the_1b_model(args.num_layers), args.tokens, args.rounds)
        else:
            raise SystemExit(f"unknown model {name!r}: use demo or 1b")


if __name__ == "__main__":
    main()
