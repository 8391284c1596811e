"""Benchmark: how close decoding several requests at once comes to what this CPU allows.

A decoding step multiplies every weight by one row of x per request. For one row the 4-bit GEMV
reads each weight once and does little with it: memory bandwidth bounds it. For 8 rows it does 8
times the products on the same bytes, and on a CPU with AVX512-VNNI the kernels do them 64 at a
time with `vpdpbusd`: that instruction's throughput bounds it. So the aggregate speed-up of 8
streams over one has a ceiling this script measures, on Llama-3.2-1B's shape (4-bit, groups of
64, every linear of a step including the tied head):

- `vpdpbusd`'s time here: a C++ loop of independent ones, compiled with g++ -march=native,
  run on as many threads at once as the kernels use;
- memory read bandwidth (numpy, as bench/cpu_kernels.py measures it);
- the engine's quantized matmuls of one step, for 1 and for 8 rows of x (random weights, on
  huge pages as loading puts them), all of a step evaluated together;

and prints each floor (8 rows: products / 64 x the instruction's time / threads; one row: the
weights' bytes / bandwidth), the kernels against them, and the steps' ratio.

    .venv/bin/python bench/batch_bound.py [--threads 2] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from cpu_kernels import LLAMA_1B, kernel_shapes, read_bandwidth  # noqa: E402

GROUP_SIZE, BITS, ROWS = 64, 4, 8

PROBE = r"""
#include <immintrin.h>
#include <chrono>
#include <cstdio>
// Independent vpdpbusd on 16 accumulators (more than its latency needs): its throughput.
int main() {
  __m512i acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_epi32(i);
  __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(5);
  const long rounds = 50000000;
  const auto start = std::chrono::steady_clock::now();
  for (long r = 0; r < rounds; ++r) {
#pragma GCC unroll 16  // the accumulators in registers: a loop would keep them in memory
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
    __asm__ volatile("" : "+v"(a), "+v"(b));  // not hoisted out of the loop
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  __m512i sum = acc[0];
  for (int i = 1; i < 16; ++i) sum = _mm512_add_epi32(sum, acc[i]);
  std::printf("%.6f %d\n", s / (rounds * 16.0) * 1e9, _mm512_reduce_add_epi32(sum) & 1);
}
"""


def vpdpbusd_ns(threads: int) -> float | None:
    """The time of one vpdpbusd (ns, 512 bits) with `threads` copies of the probe running at
    once, each on its own: what the kernels' threads get together (cores that share their
    execution units, as a VM's may, show it here). None without g++ or AVX512-VNNI."""
    with tempfile.TemporaryDirectory() as folder:
        source, program = Path(folder) / "probe.cpp", Path(folder) / "probe"
        source.write_text(PROBE)
        built = subprocess.run(
            ["g++", "-O2", "-march=native", "-o", str(program), str(source)],
            capture_output=True,
            text=True,
        )
        if built.returncode != 0:
            print(f"no vpdpbusd probe: {built.stderr.strip()[:200]}")
            return None
        probes = [
            subprocess.Popen([str(program)], stdout=subprocess.PIPE, text=True)
            for _ in range(threads)
        ]
        outputs = [probe.communicate()[0] for probe in probes]
        if any(probe.returncode != 0 for probe in probes):
            print("no vpdpbusd probe: this CPU has no AVX512-VNNI")
            return None
        return statistics.median(float(output.split()[0]) for output in outputs)


def step_shapes() -> list[tuple[int, int]]:
    """(out, in) of every linear in one decoding step, the head last (cpu_kernels' shapes,
    "q, o" standing for two a layer)."""
    layer: list[tuple[int, int]] = []
    head: list[tuple[int, int]] = []
    for name, n, k in kernel_shapes(LLAMA_1B):
        if name == "head":
            head.append((n, k))
        else:
            layer += [(n, k)] * len(name.split(", "))
    return layer * LLAMA_1B["num_layers"] + head


def matmul_times(rounds: int) -> dict[int, float]:
    """Seconds for all of a step's quantized matmuls, for 1 and ROWS rows (median of rounds,
    the two taking turns)."""
    import mlx.core as mx

    from engine import kernels

    if not kernels.available():
        raise SystemExit(f"the engine's kernels are not built: {kernels.describe()}")
    mx.random.seed(0)
    weights = []
    for n, k in step_shapes():
        quantized = mx.quantize(
            (mx.random.normal((n, k)) * 0.02).astype(mx.bfloat16), group_size=GROUP_SIZE, bits=BITS
        )
        mx.eval(quantized)
        weights.append(quantized)
    kernels.back_with_huge_pages([a for q in weights for a in q])
    laps: dict[int, list[float]] = {1: [], ROWS: []}
    for _ in range(rounds):
        for rows in laps:
            xs = {k: mx.random.normal((rows, k)).astype(mx.bfloat16) for _, k in step_shapes()}
            mx.eval(list(xs.values()))
            outs = [
                kernels.quantized_matmul(xs[k], w, scales, biases, GROUP_SIZE, BITS)
                for (_, k), (w, scales, biases) in zip(step_shapes(), weights, strict=True)
            ]
            started = time.perf_counter()
            mx.eval(outs)
            laps[rows].append(time.perf_counter() - started)
    return {rows: statistics.median(times) for rows, times in laps.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="the kernels' threads")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    shapes = step_shapes()
    products = sum(n * k for n, k in shapes)
    weight_bytes = sum(n * k // 2 + 2 * 2 * n * (k // GROUP_SIZE) for n, k in shapes)
    instruction = vpdpbusd_ns(args.threads)
    bandwidth = read_bandwidth(args.threads)[args.threads]
    times = matmul_times(args.rounds)
    one_floor = weight_bytes / bandwidth
    print(f"Llama-3.2-1B's shape, 4-bit: {products / 1e9:.2f} G products a row, "
          f"{weight_bytes / 1e6:.0f} MB of weights; {args.threads} threads; memory read "
          f"{bandwidth / 1e9:.1f} GB/s")  # fmt: skip
    print(f"1 row:  the step's matmuls {times[1] * 1e3:.1f} ms; floor (bytes / bandwidth) "
          f"{one_floor * 1e3:.1f} ms: {one_floor / times[1]:.0%} of it")  # fmt: skip
    if instruction is None:
        print(f"{ROWS} rows: the step's matmuls {times[ROWS] * 1e3:.1f} ms")
        return
    eight_floor = ROWS * products / 64 * instruction * 1e-9 / args.threads
    print(
        f"vpdpbusd: {instruction:.3f} ns each (64 products) on each of {args.threads} "
        f"threads at once"
    )
    print(f"{ROWS} rows: the step's matmuls {times[ROWS] * 1e3:.1f} ms; floor (products / 64 x "
          f"{instruction:.3f} ns / {args.threads} threads) {eight_floor * 1e3:.1f} ms: "
          f"{eight_floor / times[ROWS]:.0%} of it")  # fmt: skip
    print(f"{ROWS} rows against 1, the matmuls alone: {ROWS * times[1] / times[ROWS]:.2f}x now; "
          f"{ROWS * times[1] / eight_floor:.2f}x with {ROWS} rows at their floor and one row as "
          f"now; {ROWS * one_floor / eight_floor:.2f}x with both at their floors")  # fmt: skip


if __name__ == "__main__":
    main()
