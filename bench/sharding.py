"""Benchmark: one model on 1 process, pipeline over 2 local ranks and tensor over 2 local ranks.

The anchor is the engine in one fresh process (load_model + generate). The rings are real
runner processes on 127.0.0.1 (exo_tui.cluster.worker.local_ring), the same ones
`exo-tui chat --ranks 2` starts. Each configuration answers a short warm-up request, then the
long prompt; prints the median prefill and decode tok/s of each, the ratios against one
process, and each rank's weights (MLX active memory after loading) and peak memory while
loading.

    .venv/bin/python bench/sharding.py [--rounds 2] [--model PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.engine_vs_mlx_lm import BENCH_MODEL, MAX_TOKENS, SEED, bench_model, long_prompt  # noqa: E402

CONFIGS = ("1 process", "pipeline 2", "tensor 2")
MB = 1e6
# The engine bench's ~50M llama, with 2 key/value heads instead of 5 so 2 ranks can split them
# for tensor sharding.
SHARDING_MODEL = {**BENCH_MODEL, "num_kv_heads": 2}


def sharding_model() -> Path:
    return bench_model(SHARDING_MODEL)


def requests() -> tuple[Any, Any]:
    from engine.types import ChatRequest, Message

    warm = ChatRequest(
        messages=(Message(role="user", content="Hello there."),),
        max_tokens=8,
        temperature=0.0,
        seed=SEED,
    )
    measured = ChatRequest(
        messages=(Message(role="user", content=long_prompt()),),
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        seed=SEED,
    )
    return warm, measured


def figures(done: Any) -> dict[str, Any]:
    return {
        "prefill_tps": done.stats.prefill_tps,
        "decode_tps": done.stats.decode_tps,
        "token_ids": list(done.token_ids),
        "prompt_tokens": done.usage.prompt_tokens,
    }


def worker_single(model: str) -> dict[str, Any]:
    """The anchor, in a fresh process: the engine without a ring."""
    import gc

    from engine import blas

    blas.preload()  # before MLX loads, as in the runners
    import mlx.core as mx

    from engine.generate import generate
    from engine.loading import load_model_sync

    mx.reset_peak_memory()
    loaded = load_model_sync(model)
    gc.collect()
    mx.clear_cache()
    weights, peak = mx.get_active_memory(), mx.get_peak_memory()
    warm, measured = requests()
    list(generate(loaded, warm))
    done = list(generate(loaded, measured))[-1]
    ranks = [{"weights_bytes": weights, "peak_bytes": peak}]
    return {**figures(done), "ranks": ranks, "blas": blas.describe()}


def run_single(model: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", "--model", str(model)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_ring(model: Path, strategy: str) -> dict[str, Any]:
    from engine.loading import run_loading
    from engine.models.cards import read_card
    from engine.types import DoneChunk, ErrorChunk
    from exo_tui.cluster.worker.local_ring import start_local_ranks

    ring = run_loading(start_local_ranks(read_card(model), strategy, 2))  # type: ignore[arg-type]
    with ring:
        warm, measured = requests()
        list(ring.chat(warm))
        chunks = list(ring.chat(measured))
        errors = [c.message for c in chunks if isinstance(c, ErrorChunk)]
        if errors:
            raise SystemExit(f"{strategy}: {errors[0]}")
        done = chunks[-1]
        assert isinstance(done, DoneChunk)
        ranks = [
            {"weights_bytes": r.weights_bytes, "peak_bytes": r.peak_memory_bytes}
            for r in ring.ready
        ]
        return {**figures(done), "ranks": ranks}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--worker", action="store_true")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker_single(str(args.model))))
        return

    model = args.model or sharding_model()
    from tests.tiny_models import parameter_count

    print(f"model: {model} ({parameter_count(model) / 1e6:.1f}M parameters)", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {config: [] for config in CONFIGS}
    for round_ in range(args.rounds):
        for config in CONFIGS:
            started = time.perf_counter()
            if config == "1 process":
                result = run_single(model)
            else:
                result = run_ring(model, config.split()[0])
            runs[config].append(result)
            print(
                f"round {round_ + 1} {config:<10} prefill {result['prefill_tps']:.1f} tok/s  "
                f"decode {result['decode_tps']:.1f} tok/s  ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )

    def median(config: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[config])

    anchor = runs["1 process"][0]
    one_weights = anchor["ranks"][0]["weights_bytes"]
    print()
    print(
        f"prompt {anchor['prompt_tokens']} tokens, {MAX_TOKENS} generated, {args.rounds} rounds "
        f"(medians), BLAS: {anchor['blas']}"
    )
    print(
        "| configuration | prefill tok/s | ratio | decode tok/s | ratio | "
        "weights per rank (MB) | ratio | peak while loading per rank (MB) | same tokens |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for config in CONFIGS:
        prefill, decode = median(config, "prefill_tps"), median(config, "decode_tps")
        ranks = runs[config][0]["ranks"]
        weights = " / ".join(f"{r['weights_bytes'] / MB:.0f}" for r in ranks)
        worst = max(r["weights_bytes"] for r in ranks) / one_weights
        peaks = " / ".join(f"{r['peak_bytes'] / MB:.0f}" for r in ranks)
        same = all(r["token_ids"] == anchor["token_ids"] for r in runs[config])
        print(
            f"| {config} | {prefill:.1f} | {prefill / median('1 process', 'prefill_tps'):.2f}x "
            f"| {decode:.1f} | {decode / median('1 process', 'decode_tps'):.2f}x "
            f"| {weights} | {worst:.2f}x | {peaks} | {'yes' if same else 'NO'} |"
        )
    print("targets: pipeline 2 decode ≥ 0.80x; weights per rank ≤ 0.60x")


if __name__ == "__main__":
    main()
