"""Benchmark: the GEMVs of one decoding step of a 16- or 32-bit model, through the kernels and
through MLX's own matmul, for 1 and for 8 rows of x, in the same run.

Every linear layer of a step (q, k and v, o, gate and up, down, and the tied head), the weights
random with the model's shapes and dtype, every product of a step evaluated together, as decoding
evaluates them: the weights come from the caches that a whole step's worth of them reaches (the
demo's 15 MB of fp32 from L3), not from L2 as a loop over one matrix would have them.

    .venv/bin/python bench/step_gemv.py [--model engine/demo/model] [--rounds 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def step_shapes(config: dict[str, int]) -> list[tuple[int, int]]:
    """(out, in) of each linear of a step, the head last."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim", hidden // heads)
    kv = config.get("num_key_value_heads", heads)
    layer = [
        ((heads + 2 * kv) * head_dim, hidden),
        (hidden, heads * head_dim),
        (2 * inter, hidden),
        (hidden, inter),
    ]
    return layer * config["num_hidden_layers"] + [(config["vocab_size"], hidden)]


def timed(run: Callable[[], object], rounds: int) -> float:
    """The median seconds of one call of `run` (each evaluates a whole step)."""
    for _ in range(5):
        run()
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(10):
            run()
        times.append((time.perf_counter() - started) / 10)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", default=str(ROOT / "engine" / "demo" / "model"))
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    import mlx.core as mx

    from engine.kernels import dense_matmul, extension

    if extension() is None:
        raise SystemExit("The kernels are not built: run `make test` or `make run` once")
    config = json.loads((Path(args.model) / "config.json").read_text())
    dtype = getattr(mx, DTYPES[config.get("torch_dtype", "float32")])
    shapes = step_shapes(config)
    weights = [mx.random.normal(shape).astype(dtype) for shape in shapes]
    mx.eval(weights)
    total_mb = sum(w.nbytes for w in weights) / 1e6
    print(f"{Path(args.model).name}: {len(shapes)} linears a step, {total_mb:.1f} MB of {dtype}")
    print(f"{'rows':>4} {'kernels':>10} {'MLX':>10} {'MLX / kernels':>14} {'kernels GMAC/s':>15}")
    for rows in (1, 8):
        xs = {k: mx.random.normal((rows, k)).astype(dtype) for _, k in shapes}
        mx.eval(list(xs.values()))

        def kernels(xs: dict[int, mx.array] = xs) -> None:
            mx.eval([dense_matmul(xs[w.shape[1]], w) for w in weights])

        def plain(xs: dict[int, mx.array] = xs) -> None:
            mx.eval([xs[w.shape[1]] @ w.T for w in weights])

        ours, theirs = timed(kernels, args.rounds), timed(plain, args.rounds)
        macs = rows * sum(n * k for n, k in shapes)
        print(f"{rows:>4} {ours * 1e6:>8.0f}us {theirs * 1e6:>8.0f}us {theirs / ours:>13.2f}x "
              f"{macs / ours / 1e9:>15.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
