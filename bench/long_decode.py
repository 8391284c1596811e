"""Benchmark: a decoding step's time as the context grows, several requests together.

Each step reads every layer's keys and values once (attention), so a step grows with the
positions held. mlx-lm writes a step's keys and values with a slice update, which MLX does in
place only when nothing else holds the cache's buffer as the update is dispatched; were it to
copy, a step would also pay a whole cache's copy (at 8 rows and 3,000 positions, 25 MB a layer
for the demo). This runs mlx-lm's `BatchGenerator` (the engine's batched path) for `--rows`
requests over `--positions` steps, stop tokens off, and prints each eighth's median step: the
engine's kernels, and plain mlx-lm (`EXO_TUI_KERNELS=mlx`, each in a process of its own) as the
anchor, with the ratio. MLX's own kernels for 16-bit and quantized weights are scalar on x86, so
the anchor is only practical on the demo (`--no-mlx-lm` skips it).

    .venv/bin/python bench/long_decode.py [--model demo] [--rows 8] [--positions 3000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

EIGHTHS = 8


def measure(model: str, rows: int, positions: int) -> list[float]:
    """Median seconds a step in each eighth of the run, in this process."""
    from mlx_lm.generate import BatchGenerator

    from engine.loading import load_model_sync
    from engine.models.locations import bundled_demo_dir

    loaded = load_model_sync(str(bundled_demo_dir()) if model == "demo" else model)
    generator = BatchGenerator(loaded.model, max_tokens=positions, stop_tokens=[])
    generator.insert([[1, 2, 3, 4 + row] for row in range(rows)])  # prompts of 4 tokens
    times: list[float] = []
    started = time.perf_counter()
    while responses := generator.next_generated():
        now = time.perf_counter()
        times.append(now - started)
        started = now
        if any(response.finish_reason for response in responses):
            break
    generator.close()
    share = len(times) // EIGHTHS
    return [statistics.median(times[i * share : (i + 1) * share]) for i in range(EIGHTHS)]


def in_own_process(model: str, rows: int, positions: int, kernels: str) -> list[float]:
    """`measure` in a child process with `EXO_TUI_KERNELS=kernels` (chosen once a process)."""
    environment = dict(os.environ, EXO_TUI_KERNELS=kernels)
    command = [sys.executable, __file__, "--model", model, "--rows", str(rows),
               "--positions", str(positions), "--child"]  # fmt: skip
    result = subprocess.run(command, env=environment, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", default="demo", help="a model folder, or demo")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--positions", type=int, default=3000)
    parser.add_argument("--no-mlx-lm", action="store_true", help="skip the plain mlx-lm anchor")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.model, args.rows, args.positions)))
        return
    shape = (args.model, args.rows, args.positions)
    engine = in_own_process(*shape, "auto")
    anchor = None if args.no_mlx_lm else in_own_process(*shape, "mlx")
    print(f"{args.model}, {args.rows} rows, a step's median in each eighth of {args.positions} "
          "positions")  # fmt: skip
    print("| positions | engine ms | plain mlx-lm ms | mlx-lm / engine |")
    print("|---|---:|---:|---:|")
    share = args.positions // EIGHTHS
    for i, seconds in enumerate(engine):
        other = f"{anchor[i] * 1e3:.2f} | {anchor[i] / seconds:.2f}x" if anchor else "- | -"
        print(f"| {i * share}-{(i + 1) * share} | {seconds * 1e3:.2f} | {other} |")


if __name__ == "__main__":
    main()
