"""Benchmark: a decoding step's 4-bit GEMVs (Llama-3.2-1B's shape) for a few rows of x (several
requests decoding at once), on each path the kernels have for them, in the same run: the 8-bit
GEMV (vpdpbusd), AMX's bf16 tiles and AMX's 8-bit tiles (where the CPU has them). It measures
where the kernels switch from the GEMV to the tiles (amx_small_min_rows, amx_int8_min_rows in
engine/kernels/csrc/matmul.cpp).

Every linear layer of a step and the tied head, random weights quantized as mlx-community's
models are (4 bits, bf16 scales), evaluated together; each figure is the fastest of
--rounds x --turns steps, the paths taking turns, so that the host's noise falls on all alike.

    .venv/bin/python bench/kernel_rows.py [--rows 1,2,4,6,8,12,16] [--group-size 64]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPE = {"hidden": 2048, "intermediate": 8192, "vocab": 128256, "layers": 16, "kv": 512}


def step_shapes() -> list[tuple[int, int]]:
    h, i, kv = SHAPE["hidden"], SHAPE["intermediate"], SHAPE["kv"]
    layer = [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i)]
    return layer * SHAPE["layers"] + [(SHAPE["vocab"], h)]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rows", default="1,2,4,6,8,12,16")
    parser.add_argument("--group-size", type=int, default=64, choices=(32, 64, 128))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    import mlx.core as mx

    from engine import kernels

    ext = kernels.extension()
    if ext is None:
        raise SystemExit(f"the kernels are not available: {kernels.describe()}")
    defaults = (ext.amx_small_min_rows(), ext.amx_int8_min_rows())
    gs = args.group_size
    shapes = step_shapes()
    weights = []
    for seed, (n, k) in enumerate(shapes):
        dense = 0.02 * mx.random.normal((n, k), dtype=mx.bfloat16, key=mx.random.key(seed))
        quantized = mx.quantize(dense, group_size=gs, bits=4)
        mx.eval(quantized)
        weights.append(quantized)

    def settings(path: str) -> None:
        """The kernels' routing for `path`; "as routed" is their own."""
        ext.set_amx(path != "8-bit GEMV")
        if path == "as routed":
            ext.set_amx_small_min_rows(defaults[0])
            ext.set_amx_int8_min_rows(defaults[1])
            return
        ext.set_amx_small_min_rows(1 if path == "AMX bf16 tiles" else 1 << 30)
        ext.set_amx_int8_min_rows(1 if path == "AMX 8-bit tiles" else 1 << 30)

    paths = ["8-bit GEMV"]
    if ext.amx():
        paths.append("AMX bf16 tiles")
    if ext.amx_int8():
        paths.append("AMX 8-bit tiles")
    print(f"kernels {kernels.describe()}; {len(shapes)} GEMVs a step, group size {gs}; ms a step")
    print("| rows | " + " | ".join(paths) + " | as routed |")
    print("|---:|" + "---:|" * (len(paths) + 1))
    for rows in (int(r) for r in args.rows.split(",")):
        xs = {
            k: mx.random.normal((rows, k), dtype=mx.bfloat16, key=mx.random.key(k))
            for k in {k for _, k in shapes}
        }
        mx.eval(list(xs.values()))

        def step(xs: dict[int, mx.array] = xs) -> float:
            started = time.perf_counter()
            outs = [
                kernels.quantized_matmul(xs[k], w, s, b, gs, 4)
                for (_, k), (w, s, b) in zip(shapes, weights, strict=True)
            ]
            mx.eval(outs)
            return time.perf_counter() - started

        best: dict[str, float] = {}
        for _ in range(args.turns):
            for path in [*paths, "as routed"]:
                settings(path)
                step()  # warm: the path's buffers
                fastest = min(step() for _ in range(args.rounds))
                best[path] = min(best.get(path, fastest), fastest)
        cells = " | ".join(f"{1e3 * best[p]:.1f}" for p in [*paths, "as routed"])
        print(f"| {rows} | {cells} |", flush=True)
    settings("as routed")


if __name__ == "__main__":
    main()
