"""Benchmark: mixtures of experts on the CPU, exo-tui against plain mlx-lm and llama.cpp, same bits.

Builds once, into the user cache folder, random models of Qwen3-30B-A3B's shape (mlx-lm
qwen3_moe: hidden 2048, 48 layers, 128 experts of 768, 8 active, vocab 151936; MLX affine 4-bit
groups of 64) and of gpt-oss-20b's (gpt_oss: hidden 2880, 24 layers, 32 experts of 2880, 4
active, vocab 201088; MXFP4 experts, the rest 8-bit), a layer at a time, and llama.cpp's GGUF of
each from the very same bits (bench/moe_models.py; it checks that both sides dequantize alike).
Then prints, on `--threads` threads, prefill tok/s for 64- and 512-token prompts and decode tok/s
for

- exo-tui: the engine's loader, which routes the layers to engine/kernels, greedy decoding;
- plain mlx-lm: `mlx_lm.load` with MLX's own kernels (EXO_TUI_KERNELS=mlx), on the first
  `--mlx-lm-layers` layers only (it is slow), reported at that depth;
- llama.cpp: llama-bench on the GGUF, with repack on and off and the weights mapped or read in,
  the best of each figure (and which setting gave it);

with the ratios, and one decoding step's expert bytes read per second against this machine's
memory read bandwidth. Every measurement runs in a fresh process.

    .venv/bin/python bench/moe.py [--model qwen|gptoss|both] [--layers N] [--rounds 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common, moe_models  # noqa: E402
from bench.common import figure, ratio, read_bandwidth, summary  # noqa: E402
from bench.llama_cpp import VERSION as LLAMA_CPP_VERSION  # noqa: E402
from bench.moe_models import GPT_OSS_20B, QWEN3_30B_A3B, MoeShape  # noqa: E402

MODELS = {"qwen": QWEN3_30B_A3B, "gptoss": GPT_OSS_20B}
PROMPTS = (64, 512)
DECODE_TOKENS = 32
# llama-bench's settings: its repack (rows interleaved for its fastest CPU kernels; on by
# default) and its load mode (-lm: mmap maps the file, none reads it into memory).
LLAMA_SETTINGS = common.LLAMA_SETTINGS
WHO = ("exo_tui", "mlx_lm", "llama_cpp")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", choices=("qwen", "gptoss", "both"), default="both")
    parser.add_argument(
        "--layers", type=int, help="build and run this many layers (default: the full depth)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="exo-tui processes and llama-bench repetitions"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--prompts", default=",".join(map(str, PROMPTS)), help="prompt lengths, comma-separated"
    )
    parser.add_argument("--decode-tokens", type=int, default=DECODE_TOKENS)
    parser.add_argument(
        "--mlx-lm-layers", type=int, default=2, help="the depth plain mlx-lm runs at (it is slow)"
    )
    parser.add_argument(
        "--mlx-lm-decode-tokens", type=int, default=4, help="tokens plain mlx-lm decodes"
    )
    parser.add_argument(
        "--full-anchor", action="store_true", help="plain mlx-lm prefills every prompt too"
    )
    parser.add_argument(
        "--skip", action="append", choices=WHO, default=[], help="leave one out (repeatable)"
    )
    parser.add_argument(
        "--build-only", action="store_true", help="build (and check) the models, time nothing"
    )
    parser.add_argument(
        "--remove", action="store_true", help="delete the built models of this bench and exit"
    )
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--payload", default="{}", help=argparse.SUPPRESS)
    return parser.parse_args()


def run_as_worker(kind: str, payload: dict[str, Any]) -> None:
    if kind == "build":
        shape = moe_models.shape_from_json(payload["shape"])
        result = moe_models.worker_build(shape, Path(payload["folder"]))
    else:
        result = common.worker_model(kind, payload["folder"], payload["prompts"],
                                     payload["decode_tokens"], payload["vocab_size"])  # fmt: skip
    print(json.dumps(result))


def run_worker(kind: str, payload: dict[str, Any], threads: int, **options: bool) -> dict[str, Any]:
    return common.run_worker(__file__, kind, payload, threads, **options)


def ensure_built(shape: MoeShape, threads: int) -> Path:
    """The model's cache folder, built (and checked: the same bits both sides) if need be."""
    folder = moe_models.cache_folder(shape)
    missing = [p for p in (moe_models.mlx_folder(folder), moe_models.gguf_file(folder))
               if not p.exists()]  # fmt: skip
    if missing:
        need = len(missing) * moe_models.model_bytes(shape)
        folder.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(folder.parent).free
        if free < need + (2 << 30):
            raise SystemExit(
                f"building {shape.arch} needs about {need / 1e9:.1f} GB in {folder.parent}, "
                f"which has {free / 1e9:.1f} GB free (bench/moe.py --remove deletes old builds)"
            )
        print(f"building {', '.join(p.name for p in missing)} in {folder} (once; about "
              f"{need / 1e9:.1f} GB)", flush=True)  # fmt: skip
    task = {"shape": dataclasses.asdict(shape), "folder": str(folder)}
    result = run_worker("build", task, threads, show_stderr=True)
    checked = ", ".join(f"{n} {kind}" for kind, n in result["values"].items())
    where = "first and last rows of the embedding, head, first and last layers"
    print(f"same bits: mx.dequantize (fp32) = gguf's dequantize on {checked} values ({where})")
    return folder


def best_llama(results: dict[str, dict[str, Any]], key: str, n: int | None) -> tuple[float, str]:
    """The best figure over llama-bench's settings, and the setting that gave it."""
    best = (0.0, "")
    for setting, result in results.items():
        value = result.get(key)
        if isinstance(value, dict):
            value = value.get(str(n))  # pyright: ignore[reportUnknownMemberType]
        if isinstance(value, int | float) and value > best[0]:
            best = (float(value), setting)
    return best


median = common.median


def bench_model(name: str, shape: MoeShape, args: argparse.Namespace, bin_dir: Path | None,
                bandwidth: float) -> None:  # fmt: skip
    threads: int = args.threads
    prompts = [int(p) for p in args.prompts.split(",")]
    folder = ensure_built(shape, threads)
    if args.build_only:
        return
    source = moe_models.mlx_folder(folder)
    payload = {"vocab_size": shape.vocab_size, "prompts": prompts}
    engine: list[dict[str, Any]] = []
    if "exo_tui" not in args.skip:
        for round_ in range(args.rounds):
            result = run_worker("engine", {**payload, "folder": str(source),
                                           "decode_tokens": args.decode_tokens}, threads,
                                check=False)  # fmt: skip
            engine.append(result)
            print(f"{name} exo-tui round {round_ + 1}: {summary(result)}", flush=True)
            if "error" in result:
                break
    anchor: list[dict[str, Any]] = []
    anchor_layers = min(max(args.mlx_lm_layers, 2 if shape.arch == "gpt_oss" else 1),
                        shape.num_layers)  # fmt: skip
    if "mlx_lm" not in args.skip:
        view = moe_models.reduced_view(source, shape, anchor_layers)
        anchor_prompts = prompts if args.full_anchor else prompts[:1]
        print(f"{name} mlx-lm, {anchor_layers} of {shape.num_layers} layers: MLX's own kernels",
              flush=True)  # fmt: skip
        result = run_worker("mlx_lm", {**payload, "folder": str(view), "prompts": anchor_prompts,
                                       "decode_tokens": args.mlx_lm_decode_tokens}, threads,
                            check=False)  # fmt: skip
        anchor.append(result)
        print(f"{name} mlx-lm: {summary(result)}", flush=True)
    llama: dict[str, dict[str, Any]] = {}
    if bin_dir is not None:
        for setting, options in LLAMA_SETTINGS.items():
            result = common.llama_bench(bin_dir, moe_models.gguf_file(folder), threads, prompts,
                                        args.decode_tokens, args.rounds, options)  # fmt: skip
            llama[setting] = result
            print(f"{name} llama.cpp {setting}: {summary(result)}", flush=True)
    print_table(shape, prompts, engine, anchor, anchor_layers, llama, bandwidth, args)


def print_table(
    shape: MoeShape,
    prompts: list[int],
    engine: list[dict[str, Any]],
    anchor: list[dict[str, Any]],
    anchor_layers: int,
    llama: dict[str, dict[str, Any]],
    bandwidth: float,
    args: argparse.Namespace,
) -> None:
    layers = shape.num_layers
    print()
    print(f"{moe_models.TITLES[shape.arch]}; {layers} layers; {args.threads} threads")
    kernels = next((r["kernels"] for r in engine if "kernels" in r), "-")
    print(f"exo-tui: median over {len(engine)} processes, kernels: {kernels}")
    print(f"llama.cpp: llama-bench -r {args.rounds} (its average), the best of its settings")
    print(f"| figure | exo-tui | mlx-lm ({anchor_layers} of {layers} layers) | llama.cpp "
          "| exo-tui / llama.cpp | llama.cpp's best setting |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    rows: list[tuple[str, str, int | None]] = [
        *((f"prefill {n} tok/s", "prefill_tps", n) for n in prompts),
        ("decode tok/s", "decode_tps", None),
    ]
    for text, key, n in rows:
        e = median(engine, key, n)
        m = median(anchor, key, n)
        c, setting = best_llama(llama, key, n)
        print(f"| {text} | {figure(e)} | {figure(m)} | {figure(c)} | {ratio(e, c)} "
              f"| {setting or '-'} |")  # fmt: skip
    step = moe_models.expert_bytes_per_token(shape)
    cells = []
    decoders = [
        ("exo-tui", median(engine, "decode_tps", None), layers),
        ("mlx-lm", median(anchor, "decode_tps", None), anchor_layers),
        ("llama.cpp", best_llama(llama, "decode_tps", None)[0], layers),
    ]
    for who, tps, depth in decoders:
        if tps:
            experts = moe_models.expert_bytes_per_token(shape, depth) * tps
            weights = moe_models.bytes_per_token(shape, depth) * tps
            cells.append(
                f"{who} {experts / 1e9:.2f} GB/s of experts ({experts / bandwidth:.0%}), "
                f"{weights / 1e9:.2f} GB/s in all ({weights / bandwidth:.0%})"
            )
    every = moe_models.bytes_per_token(shape)
    print(f"one decoding step reads {step / 1e6:.0f} MB of experts ({shape.experts_per_token} of "
          f"{shape.num_experts} a layer), {every / 1e6:.0f} MB in all (attention, routers, head); "
          f"against {bandwidth / 1e9:.1f} GB/s read with {args.threads} threads, at the decode "
          f"rates: {'; '.join(cells) or '-'}")  # fmt: skip
    m = median(anchor, "decode_tps", None)
    if m and anchor_layers < layers:
        print(f"plain mlx-lm ran {anchor_layers} of {layers} layers: its figures are at that "
              f"depth (scaled by {anchor_layers}/{layers}, an estimate that scales its embedding "
              f"and head too, its decode would be {m * anchor_layers / layers:.3g} tok/s); "
              f"{'every prompt' if args.full_anchor else f'prefill {prompts[0]} only'}, decode "
              f"over {args.mlx_lm_decode_tokens} tokens")  # fmt: skip
    for who, runs in (("exo-tui", engine), ("mlx-lm", anchor)):
        for run in runs:
            if "error" in run:
                print(f"{who} failed: {run['error']}")
    if llama:
        heads = " | ".join(f"prefill {n}" for n in prompts)
        print(f"| llama.cpp setting | {heads} | decode |")
        print("|---|" + "---|" * (len(prompts) + 1))
        for setting, result in llama.items():
            if "error" in result:
                lines = result["error"].splitlines()
                print(f"| {setting} | did not run: {lines[0].split(':')[0]}: {lines[-1]} |")
                continue
            cells = [figure(result["prefill_tps"].get(str(n))) for n in prompts]
            print(f"| {setting} | {' | '.join(cells)} | {figure(result['decode_tps'])} |")
        build = next((r["build"] for r in llama.values() if "build" in r), "?")
        print(f"llama.cpp: llama-cpp-python {LLAMA_CPP_VERSION}'s copy, build {build}")
    print(flush=True)


def main() -> None:
    args = parse_args()
    if args.worker:
        run_as_worker(args.worker, json.loads(args.payload))
        return
    names = list(MODELS) if args.model == "both" else [args.model]
    shapes = {n: MODELS[n] if args.layers is None else
              dataclasses.replace(MODELS[n], num_layers=args.layers) for n in names}  # fmt: skip
    if args.remove:
        for folder in sorted(moe_models.cache_folder(MODELS["qwen"]).parent.glob("moe-v*")):
            print(f"removing {folder}")
            shutil.rmtree(folder)
        return
    for shape in shapes.values():
        if shape.arch == "gpt_oss" and shape.num_layers < 2:
            raise SystemExit("gpt-oss needs 2 layers at least (a sliding and a full one)")
    bin_dir = None
    if "llama_cpp" not in args.skip and not args.build_only:
        from bench import llama_cpp

        bin_dir = llama_cpp.ensure_built()
    bandwidth = 0.0
    if not args.build_only:
        reads = read_bandwidth(args.threads)
        bandwidth = reads[args.threads]
        print(f"memory read (numpy sum of 1 GiB): 1 thread {reads[1] / 1e9:.1f} GB/s, "
              f"{args.threads} threads {bandwidth / 1e9:.1f} GB/s", flush=True)  # fmt: skip
    for name, shape in shapes.items():
        bench_model(name, shape, args, bin_dir, bandwidth)


if __name__ == "__main__":
    main()
