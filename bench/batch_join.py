"""Benchmark: what requests pay to join a batch, in one process.

N requests for the same (cached) prompt, each from a thread of its own, started `--gap-ms` apart
as a client's requests reach a server, decode together through `BatchEngine` (what
`exo-tui serve` runs). Before all of them decode in one step, the batch takes their first passes
and merges their caches into its own; this prints, the median of the rounds, when the last of
them has its first token and its second (from the first request's start), and the round's rate.
The anchor, in the same process: one request alone, its first token and its rate.

    .venv/bin/python bench/batch_join.py [--model PATH] [--requests 8] [--gap-ms 2] [--rounds 5]

`--model` takes a model folder (default the demo), e.g. the 4-bit llama of Llama-3.2-1B's shape
that bench/cpu_kernels.py builds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "hello, who are you and what can you do?"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", default=str(ROOT / "engine" / "demo" / "model"))
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--gap-ms", type=float, default=2.0)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from engine.batching import BatchEngine
    from engine.loading import load_model_sync
    from engine.types import ChatRequest, DoneChunk, Message

    request = ChatRequest(
        messages=(Message(role="user", content=PROMPT),), temperature=0, max_tokens=args.max_tokens
    )
    loaded = load_model_sync(Path(args.model))
    batch = BatchEngine(loaded, max(8, args.requests))

    def one_round(count: int) -> tuple[list[float], list[float], float, int]:
        """Each request's first and second token (s from the start), the wall, the tokens."""
        firsts, seconds, tokens = [0.0] * count, [0.0] * count, [0] * count
        started = time.perf_counter()

        def run(index: int) -> None:
            time.sleep(index * args.gap_ms / 1000)
            seen = 0
            for chunk in batch.generate(request):
                if isinstance(chunk, DoneChunk):
                    tokens[index] = chunk.usage.completion_tokens
                    continue
                seen += 1
                if seen <= 2:
                    (firsts if seen == 1 else seconds)[index] = time.perf_counter() - started

        threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return firsts, seconds, time.perf_counter() - started, sum(tokens)

    try:
        one_round(1)  # warm-up: the prompt is cached from here on
        one_round(args.requests)
        alone = [one_round(1) for _ in range(args.rounds)]
        together = [one_round(args.requests) for _ in range(args.rounds)]
    finally:
        batch.close()
    first_alone = statistics.median(r[0][0] for r in alone)
    rate_alone = statistics.median(r[3] / r[2] for r in alone)
    last_first = statistics.median(max(r[0]) for r in together)
    last_second = statistics.median(max(r[1]) for r in together)
    rate = statistics.median(r[3] / r[2] for r in together)
    print(f"{loaded.card.name}, the median of {args.rounds} rounds")
    print(f"one request alone: first token {first_alone * 1e3:.0f} ms, {rate_alone:.1f} tok/s")
    print(f"{args.requests} requests {args.gap_ms:g} ms apart: every first token by "
          f"{last_first * 1e3:.0f} ms, every second by {last_second * 1e3:.0f} ms, "
          f"{rate:.1f} tok/s ({rate / rate_alone:.2f}x one alone)")  # fmt: skip


if __name__ == "__main__":
    main()
