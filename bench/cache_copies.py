"""Benchmark: what a KV cache's update costs when the next step is sent before the last has run.

mlx-lm's caches write each step's keys and values with a slice update (`keys[..., i, :] = k`).
MLX writes it in place only when nothing else holds the cache's buffer at the moment the update
is dispatched; otherwise it copies the whole buffer first. Decoding (mlx-lm's `generate_step`
and `BatchGenerator`, so the engine's both paths) dispatches step N+1 while step N still runs,
and step N's reads of the cache hold it, so every step copies every layer's keys and values.

This script times one layer's update and a read of it, step after step, for a cache of
Llama-3.2-1B's shape (8 key-value heads of 64, bf16) and the demo's (4 heads of 64, fp32), for 1
and 8 rows and growing capacities: each step evaluated before the next ("in place") and the
next dispatched first, as decoding does ("pipelined"). It prints each step's time and the
difference times the model's layers and their two caches (an estimate for a whole step: the
copy overlaps other work, so at small capacities the pipelined step is the faster).

    .venv/bin/python bench/cache_copies.py [--steps 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx

SHAPES = {  # name: (kv heads, head dim, dtype, layers)
    "1B": (8, 64, mx.bfloat16, 16),
    "demo": (4, 64, mx.float32, 4),
}


def step_time(rows: int, heads: int, dim: int, dtype: mx.Dtype, capacity: int, steps: int,
              pipelined: bool) -> float:  # fmt: skip
    """Median seconds a step: write one position of the cache, then read all it holds."""
    keys = mx.zeros((rows, heads, capacity, dim), dtype)
    mx.eval(keys)
    previous: mx.array | None = None
    times: list[float] = []
    started = time.perf_counter()
    for i in range(min(steps, capacity)):
        keys[..., i : i + 1, :] = mx.ones((rows, heads, 1, dim), dtype)
        read = keys[..., : i + 1, :].astype(mx.float32).sum()
        if pipelined:  # as decoding does: this step sent, then the last one waited for
            mx.async_eval(read)
            if previous is not None:
                mx.eval(previous)
            previous = read
        else:
            mx.eval(read)
        now = time.perf_counter()
        times.append(now - started)
        started = now
    if previous is not None:
        mx.eval(previous)
    return statistics.median(times[len(times) // 4 :])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    print("| cache | rows | capacity | MB | in place | pipelined | a step's extra (est.) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, (heads, dim, dtype, layers) in SHAPES.items():
        for rows in (1, 8):
            for capacity in (256, 1024, 4096):
                size = rows * heads * capacity * dim * dtype.size / 1e6
                alone = step_time(rows, heads, dim, dtype, capacity, args.steps, False)
                ahead = step_time(rows, heads, dim, dtype, capacity, args.steps, True)
                # Keys and values: two caches a layer.
                extra = 2 * layers * max(ahead - alone, 0.0)
                print(f"| {name} | {rows} | {capacity} | {size:.1f} | {alone * 1e3:.2f} ms | "
                      f"{ahead * 1e3:.2f} ms | {extra * 1e3:.1f} ms |")  # fmt: skip


if __name__ == "__main__":
    main()
