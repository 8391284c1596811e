"""Benchmark: the engine's CPU matmul kernels against plain mlx-lm and llama.cpp, same weights.

Builds once, into the user cache folder, a random-weight llama of Llama-3.2-1B's shape (hidden
2048, 16 layers, 32 heads of 64, 8 KV heads, MLP 8192, vocab 128256, tied embeddings) as bf16
and as mlx-lm's 4-bit (groups of 64), and the same bf16 weights as a llama.cpp GGUF (F16, then
Q4_0 by llama-quantize). Then prints, on `--threads` threads, prefill tok/s for 64- and
512-token prompts and decode tok/s for

- the engine: its loader, which routes the linears to engine/kernels,
- plain mlx-lm: `mlx_lm.load` with MLX's own kernels (EXO_TUI_KERNELS=mlx),
- llama.cpp: llama-bench on the GGUF (bf16 against F16, 4-bit against Q4_0),

and each kernel alone on the model's shapes, in GB/s of weights read against this machine's
memory read bandwidth. Every model measurement runs in a fresh subprocess.

    .venv/bin/python bench/cpu_kernels.py [--quick] [--rounds 3] [--full-anchor]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402
from bench.common import (  # noqa: E402  (read_bandwidth: bench/batch_bound.py takes it from here)
    add_stand_in_vocab,
    engine_first,
    figure,
    last_level_cache_bytes,
    next_logits,
    prompt_tokens,
    ratio,
    read_bandwidth,
    summary,
    worker_model,
)

# Llama-3.2-1B's shape. The rope is plain (no llama3 frequency scaling): speed does not depend
# on the frequencies, and llama.cpp would need a rope_freqs tensor for the scaled one.
LLAMA_1B: dict[str, int] = {
    "hidden_size": 2048,
    "num_layers": 16,
    "num_heads": 32,
    "num_kv_heads": 8,
    "intermediate_size": 8192,
    "vocab_size": 128256,
}
QUICK: dict[str, int] = {
    "hidden_size": 512,
    "num_layers": 2,
    "num_heads": 8,
    "num_kv_heads": 2,
    "intermediate_size": 2048,
    "vocab_size": 32000,
}
ROPE_THETA = 500000.0
RMS_EPS = 1e-5
CONTEXT = 131072
GROUP_SIZE, BITS = 64, 4
PROMPTS = (64, 512)
DECODE_TOKENS = 32
# MLX's own CPU kernels need seconds per decode step and minutes per 4-bit prefill at the full
# size: the plain mlx-lm anchor decodes a few tokens and prefills only the short prompt.
ANCHOR_DECODE_TOKENS = {"bf16": 8, "q4": 3}
SEED = 0
# Bump when what is built changes, so the cache builds again.
BUILD_VERSION = 1
VARIANTS = {"bf16": "bf16", "q4": f"{BITS}-bit g{GROUP_SIZE}"}
GGUF_NAMES = {"bf16": ("model-f16.gguf", "F16"), "q4": ("model-q4_0.gguf", "Q4_0")}


# --------------------------------------------------------------------------- the models


def shape_from_args(args: argparse.Namespace) -> dict[str, int]:
    """The llama's shape: Llama-3.2-1B's (or --quick's) with the options given on top. A new
    width without head counts keeps heads of 64 and the 1B's ratios (4 heads a KV head, MLP 4x)."""
    shape = dict(QUICK if args.quick else LLAMA_1B)
    if args.hidden_size is not None:
        heads = max(1, args.hidden_size // 64)
        shape.update(
            hidden_size=args.hidden_size,
            num_heads=heads,
            num_kv_heads=max(1, heads // 4),
            intermediate_size=4 * args.hidden_size,
        )
    for key in ("num_layers", "num_heads", "num_kv_heads", "intermediate_size", "vocab_size"):
        if getattr(args, key) is not None:
            shape[key] = getattr(args, key)
    if shape["hidden_size"] % shape["num_heads"] or shape["num_heads"] % shape["num_kv_heads"]:
        raise SystemExit("num_heads must divide hidden_size and num_kv_heads divide num_heads")
    if shape["hidden_size"] % GROUP_SIZE or shape["intermediate_size"] % GROUP_SIZE:
        raise SystemExit(f"hidden and intermediate sizes must be multiples of {GROUP_SIZE}")
    return shape


def cache_folder(shape: dict[str, int]) -> Path:
    import platformdirs

    key = "-".join(f"{k}{v}" for k, v in sorted(shape.items()))
    return platformdirs.user_cache_path("exo-tui") / "bench" / f"cpu-kernels-v{BUILD_VERSION}-{key}"


def paths(folder: Path) -> dict[str, Path]:
    return {
        "bf16": folder / "bf16",
        "q4": folder / "q4",
        "gguf_bf16": folder / GGUF_NAMES["bf16"][0],
        "gguf_q4": folder / GGUF_NAMES["q4"][0],
    }


def parameter_count(shape: dict[str, int]) -> int:
    h, i, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    kv = shape["num_kv_heads"] * h // shape["num_heads"]
    per_layer = 2 * h * h + 2 * kv * h + 3 * h * i + 2 * h
    return shape["num_layers"] * per_layer + v * h + h


def build_mlx_bf16(folder: Path, shape: dict[str, int]) -> None:
    """The bf16 model folder: config, the tiny trained tokenizer (its ids are a prefix of the
    model's 128256: the benchmark feeds token ids, never text) and random weights."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama

    from tests.tiny_models import build_tokenizer, model_config

    folder.mkdir(parents=True)
    config = model_config(
        "llama",
        hidden_size=shape["hidden_size"],
        num_layers=shape["num_layers"],
        num_heads=shape["num_heads"],
        num_kv_heads=shape["num_kv_heads"],
        intermediate_size=shape["intermediate_size"],
        vocab_size=shape["vocab_size"],
        max_position_embeddings=CONTEXT,
        tie_word_embeddings=True,
        dtype="bfloat16",
    )
    config.update(rope_theta=ROPE_THETA, rms_norm_eps=RMS_EPS)
    build_tokenizer(folder, 768, seed=SEED)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    params = sorted(cast("list[tuple[str, Any]]", tree_flatten(model.parameters())))
    keys = mx.random.split(mx.random.key(SEED), num=len(params))
    weights: dict[str, mx.array] = {}
    for key, (name, value) in zip(keys, params, strict=True):
        if name.endswith("norm.weight"):
            weights[name] = mx.ones(value.shape, dtype=mx.bfloat16)
        else:
            # A pretrained model's spread: activations stay O(1), nothing overflows in f16.
            weights[name] = 0.02 * mx.random.normal(value.shape, dtype=mx.bfloat16, key=key)
        mx.eval(weights[name])
    model.load_weights(list(weights.items()), strict=True)  # checks names and shapes
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def build_mlx_q4(source: Path, folder: Path) -> None:
    """mlx-lm's own 4-bit conversion of the bf16 folder (scales and biases in bf16)."""
    from mlx_lm import convert

    convert(str(source), str(folder), quantize=True, q_group_size=GROUP_SIZE, q_bits=BITS,
            dtype="bfloat16")  # fmt: skip


def llama_cpp_permute(weights: Any, n_head: int) -> Any:
    """convert_hf_to_gguf's LlamaModel.permute: llama.cpp rotates adjacent pairs of a head's
    dimensions, HF/mlx-lm its two halves, so the rows of q and k are interleaved."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def build_gguf_f16(source: Path, target: Path, shape: dict[str, int]) -> None:
    """The bf16 folder's weights as a llama.cpp F16 GGUF, as convert_hf_to_gguf writes a llama."""
    import gguf
    import mlx.core as mx
    import numpy as np

    config = json.loads((source / "config.json").read_text())
    layers, heads, kv_heads = shape["num_layers"], shape["num_heads"], shape["num_kv_heads"]
    writer = gguf.GGUFWriter(target, "llama")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(shape["hidden_size"])
    writer.add_block_count(layers)
    writer.add_feed_forward_length(shape["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_dimension_count(shape["hidden_size"] // heads)
    writer.add_vocab_size(shape["vocab_size"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    add_stand_in_vocab(writer, shape["vocab_size"])

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, layers)
    weights = mx.load(str(source / "model.safetensors"))
    assert isinstance(weights, dict)
    for name in sorted(weights):
        gguf_name = names.get_name(name, try_suffixes=(".weight",))
        if gguf_name is None:
            raise ValueError(f"no GGUF name for {name}")
        w = weights[name]
        # As the converter does: 1-D tensors (the norms) in f32, matrices in f16.
        array = np.array(w.astype(mx.float32 if w.ndim == 1 else mx.float16))
        if name.endswith("q_proj.weight"):
            array = llama_cpp_permute(array, heads)
        elif name.endswith("k_proj.weight"):
            array = llama_cpp_permute(array, kv_heads)
        writer.add_tensor(gguf_name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def worker_build(shape: dict[str, int], folder: str) -> dict[str, Any]:
    """Build whatever of the cache folder is missing; each piece is renamed into place whole."""
    engine_first()
    import mlx.core as mx

    from engine.loading import load_model_sync

    built: list[str] = []
    target = paths(Path(folder))
    target["bf16"].parent.mkdir(parents=True, exist_ok=True)
    for kind in ("bf16", "q4", "gguf_bf16"):
        if target[kind].exists():
            continue
        partial = target[kind].with_name(target[kind].name + ".partial")
        if partial.is_dir():
            shutil.rmtree(partial)
        partial.unlink(missing_ok=True)
        if kind == "bf16":
            build_mlx_bf16(partial, shape)
        elif kind == "q4":
            build_mlx_q4(target["bf16"], partial)
        else:
            build_gguf_f16(target["bf16"], partial, shape)
        partial.rename(target[kind])
        built.append(kind)
    for kind in [k for k in ("bf16", "q4") if k in built]:
        # It loads (with mlx-lm's loader, as the engine does) and gives finite logits.
        loaded = load_model_sync(target[kind])
        logits = next_logits(loaded.model, prompt_tokens(8, shape["vocab_size"]), None)
        if not bool(mx.all(mx.isfinite(logits)).item()):
            raise SystemExit(f"the {kind} model gives non-finite logits")
    return {"built": built}


def ensure_models(shape: dict[str, int], folder: Path, threads: int) -> dict[str, Path]:
    target = paths(folder)
    from bench import llama_cpp

    bin_dir = llama_cpp.ensure_built()
    if not all(target[k].exists() for k in ("bf16", "q4", "gguf_bf16")):
        print(f"building the bench models in {folder} (once)", flush=True)
        result = run_worker("build", {"shape": shape, "folder": str(folder)}, threads)
        print(f"built {', '.join(result['built'])}", flush=True)
        if "gguf_bf16" in result["built"]:
            target["gguf_q4"].unlink(missing_ok=True)  # quantized from an older F16 file
    if not target["gguf_q4"].exists():
        partial = target["gguf_q4"].with_name(target["gguf_q4"].name + ".partial")
        # --pure: every tensor Q4_0, as mlx-lm quantizes every linear and the tied embedding to
        # 4 bits (without it the tied embedding, llama.cpp's head, would be Q6_K).
        subprocess.run(
            [str(bin_dir / "llama-quantize"), "--pure", str(target["gguf_bf16"]), str(partial),
             "Q4_0", str(threads)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        partial.rename(target["gguf_q4"])
    return target


# --------------------------------------------------------------------------- model workers


def llama_bench(
    bin_dir: Path, model: Path, threads: int, prompts: list[int], rounds: int
) -> dict[str, Any]:
    """llama-bench's best averages over its settings (repack on and off, weights mapped and read
    in): a setting that crashes (the repack did on the Intel machine) did not run."""
    results = {
        setting: common.llama_bench(
            bin_dir, model, threads, prompts, DECODE_TOKENS, rounds, options
        )
        for setting, options in common.LLAMA_SETTINGS.items()
    }
    return common.best_of_settings(results)


# --------------------------------------------------------------------------- kernels alone


def kernel_shapes(shape: dict[str, int]) -> list[tuple[str, int, int]]:
    """The model's linears as (name, out, in)."""
    h, i, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    kv = shape["num_kv_heads"] * h // shape["num_heads"]
    return [("q, o", h, h), ("k, v", kv, h), ("gate, up", i, h), ("down", h, i), ("head", v, h)]


def worker_kernels(shape: dict[str, int], rotate_bytes: int, min_seconds: float) -> dict[str, Any]:
    """Seconds per call of each extension op on each shape, for 1 and 64 rows of x. Each call
    reads another copy of the weights, round a ring of copies larger than the last-level cache,
    so the weights come from memory as in a forward pass."""
    engine_first()
    import mlx.core as mx

    from engine import kernels

    if not kernels.available():
        raise SystemExit(f"the kernels are not available: {kernels.describe()}")
    rows_list = (1, 64)
    results: list[dict[str, Any]] = []
    for fmt in ("bf16", "q4"):
        for name, n, k in kernel_shapes(shape):
            base = 0.02 * mx.random.normal((n, k), dtype=mx.bfloat16, key=mx.random.key(SEED))
            if fmt == "q4":
                weights = list(mx.quantize(base, group_size=GROUP_SIZE, bits=BITS))
            else:
                weights = [base]
            mx.eval(weights)
            nbytes = sum(w.nbytes for w in weights)
            count = max(2, math.ceil(rotate_bytes / nbytes))
            # Copies by arithmetic, so each is its own buffer (their values do not matter).
            copies = [[w + mx.array(0, dtype=w.dtype) for w in weights] for _ in range(count)]
            mx.eval(copies)
            del base, weights

            def call(ws: list[Any], x: Any, fmt: str = fmt) -> Any:
                if fmt == "q4":
                    return kernels.quantized_matmul(x, ws[0], ws[1], ws[2], GROUP_SIZE, BITS)
                return kernels.dense_matmul(x, ws[0])

            for rows in rows_list:
                x = mx.random.normal((rows, k), dtype=mx.bfloat16, key=mx.random.key(SEED + 1))
                mx.eval(x)
                for ws in copies[:2]:
                    mx.eval(call(ws, x))
                per_call: list[float] = []
                started = time.perf_counter()
                while len(per_call) < 3 or time.perf_counter() - started < min_seconds:
                    lap = time.perf_counter()
                    # One evaluation a lap: the calls run one after another, without a wait
                    # between them that would count in a small kernel's time.
                    mx.eval([call(ws, x) for ws in copies])
                    per_call.append((time.perf_counter() - lap) / count)
                seconds = statistics.median(per_call)
                results.append({"format": fmt, "name": name, "n": n, "k": k, "rows": rows,
                                "bytes": nbytes, "copies": count, "seconds": seconds})  # fmt: skip
            del copies
            mx.clear_cache()
    return {"kernels": kernels.describe(), "results": results}


# --------------------------------------------------------------------------- running


def run_worker(kind: str, payload: dict[str, Any], threads: int) -> dict[str, Any]:
    return common.run_worker(__file__, kind, payload, threads)


def run_as_worker(kind: str, payload: dict[str, Any]) -> None:
    if kind == "build":
        result = worker_build(payload["shape"], payload["folder"])
    elif kind == "kernels":
        result = worker_kernels(payload["shape"], payload["rotate_bytes"], payload["min_seconds"])
    else:
        result = worker_model(kind, payload["folder"], payload["prompts"],
                              payload["decode_tokens"], payload["vocab_size"])  # fmt: skip
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="a tiny llama (2 layers, hidden 512): a smoke run"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="engine processes and llama-bench repetitions"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--full-anchor", action="store_true", help="plain mlx-lm runs it all too (very slow)"
    )
    parser.add_argument("--skip-mlx-lm", action="store_true", help="no plain mlx-lm anchor")
    parser.add_argument("--skip-kernels", action="store_true", help="no single-kernel timings")
    parser.add_argument(
        "--rotate-mib", type=int, help="weights a kernel timing cycles over (default 2x the L3)"
    )
    for option in ("hidden-size", "num-layers", "num-heads", "num-kv-heads",
                   "intermediate-size", "vocab-size"):  # fmt: skip
        parser.add_argument(f"--{option}", type=int, default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--payload", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_as_worker(args.worker, json.loads(args.payload))
        return

    shape = shape_from_args(args)
    threads: int = args.threads
    folder = cache_folder(shape)
    target = ensure_models(shape, folder, threads)
    from bench import llama_cpp

    bin_dir = llama_cpp.ensure_built(log=False)
    llc = last_level_cache_bytes()
    bandwidth = read_bandwidth(threads)
    # Gigabytes per second, 10^9 bytes, as llama.cpp and memory vendors count them.
    print(
        f"model: llama {parameter_count(shape) / 1e9:.2f}B ({', '.join(f'{k} {v}' for k, v in shape.items())}, "  # noqa: E501
        f"tied embeddings) in {folder}\n"
        f"memory read (numpy sum of 1 GiB): 1 thread {bandwidth[1] / 1e9:.1f} GB/s, "
        f"{threads} threads {bandwidth[threads] / 1e9:.1f} GB/s; last-level cache "
        f"{(llc or 0) / 2**20:.0f} MiB",
        flush=True,
    )

    kernel_rows: list[dict[str, Any]] = []
    kernels_line = ""
    if not args.skip_kernels:
        if args.rotate_mib is not None:
            rotate = args.rotate_mib << 20
        else:
            rotate = 256 << 20 if args.quick else max(2 * (llc or 0), 1 << 30)
        task = {"shape": shape, "rotate_bytes": rotate, "min_seconds": 0.3 if args.quick else 1.0}
        report = run_worker("kernels", task, threads)
        kernel_rows, kernels_line = report["results"], report["kernels"]
        print(f"kernels timed alone, rotating over {rotate / 2**20:.0f} MiB of weights", flush=True)

    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    anchor_prompts = list(PROMPTS) if args.full_anchor else [PROMPTS[0]]
    for variant in VARIANTS:
        payload = {"folder": str(target[variant]), "vocab_size": shape["vocab_size"]}
        for round_ in range(args.rounds):
            result = run_worker("engine", {**payload, "prompts": list(PROMPTS),
                                           "decode_tokens": DECODE_TOKENS}, threads)  # fmt: skip
            runs.setdefault((variant, "engine"), []).append(result)
            kernels_line = kernels_line or result["kernels"]
            print(f"{variant} engine round {round_ + 1}: {summary(result)}", flush=True)
        if not args.skip_mlx_lm:
            decode = DECODE_TOKENS if args.full_anchor else ANCHOR_DECODE_TOKENS[variant]
            print(f"{variant} mlx-lm: MLX's own kernels, minutes at the full size", flush=True)
            result = run_worker("mlx_lm", {**payload, "prompts": anchor_prompts,
                                           "decode_tokens": decode}, threads)  # fmt: skip
            runs[(variant, "mlx_lm")] = [result]
            print(f"{variant} mlx-lm ({decode} tokens decoded): {summary(result)}", flush=True)
        result = llama_bench(bin_dir, target[f"gguf_{variant}"], threads, list(PROMPTS),
                             args.rounds)  # fmt: skip
        runs[(variant, "llama_cpp")] = [result]
        print(f"{variant} llama.cpp {GGUF_NAMES[variant][1]}: {summary(result)}", flush=True)
        for figure_name, setting in result.get("best_setting", {}).items():
            print(f"  llama.cpp's best {figure_name}: {setting}", flush=True)
        for setting, error in result.get("failed", {}).items():
            print(f"  llama.cpp {setting} did not run: {error}", flush=True)

    print_tables(runs, kernel_rows, bandwidth[threads], threads, kernels_line, args)


def print_tables(
    runs: dict[tuple[str, str], list[dict[str, Any]]],
    kernel_rows: list[dict[str, Any]],
    bandwidth: float,
    threads: int,
    kernels_line: str,
    args: argparse.Namespace,
) -> None:
    def median(variant: str, who: str, key: str, n: int | None = None) -> float | None:
        return common.median(runs.get((variant, who), []), key, n)

    print()
    print(
        f"{threads} threads; engine kernels: {kernels_line}; engine: median over {args.rounds} "
        f"processes; llama.cpp: llama-bench -r {args.rounds} (its average), the best of repack "
        "on/off and weights mapped/read in (each figure's setting above)"
    )
    print(
        "engine: its loader (the kernels, its numpy attention, the system OpenBLAS); mlx-lm: "
        "mlx_lm.load (MLX's own kernels and attention, the wheel's BLAS); same forward pass"
    )
    print("| figure | engine | mlx-lm | llama.cpp | engine / llama.cpp | engine / mlx-lm |")
    print("|---|---|---|---|---|---|")
    for variant, label in VARIANTS.items():
        anchor = f"{label} (llama.cpp {GGUF_NAMES[variant][1]})"
        rows: list[tuple[str, str, int | None]] = [
            *((f"{anchor} prefill {n} tok/s", "prefill_tps", n) for n in PROMPTS),
            (f"{anchor} decode tok/s", "decode_tps", None),
        ]
        for text, key, n in rows:
            e = median(variant, "engine", key, n)
            m = median(variant, "mlx_lm", key, n)
            c = median(variant, "llama_cpp", key, n)
            skipped = args.skip_mlx_lm or (n is not None and n not in PROMPTS[:1]
                                           and not args.full_anchor)  # fmt: skip
            m_text = "skipped" if skipped and m is None else figure(m)
            print(f"| {text} | {figure(e)} | {m_text} | {figure(c)} | {ratio(e, c)} "
                  f"| {ratio(e, m)} |")  # fmt: skip
    for variant in VARIANTS:
        error = runs.get((variant, "llama_cpp"), [{}])[0].get("error")
        if error:
            print(f"llama.cpp {GGUF_NAMES[variant][1]}: {error}")
    if not args.skip_mlx_lm and not args.full_anchor:
        print(f"plain mlx-lm: prefill {PROMPTS[0]} only, decode over "
              f"{ANCHOR_DECODE_TOKENS['bf16']} (bf16) and {ANCHOR_DECODE_TOKENS['q4']} (4-bit) "
              "tokens; --full-anchor for all (MLX's own kernels: minutes)")  # fmt: skip
    if not kernel_rows:
        return
    print()
    print(f"kernels alone, against {bandwidth / 1e9:.1f} GB/s read with {threads} threads")
    print("| weights | shape (out x in) | MiB | rows | ms a call | GB/s of weights "
          "| of bandwidth | GFLOP/s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for row in kernel_rows:
        seconds, nbytes = row["seconds"], row["bytes"]
        flops = 2 * row["rows"] * row["n"] * row["k"] / seconds
        print(f"| {VARIANTS[row['format']]} {row['name']} | {row['n']} x {row['k']} "
              f"| {nbytes / 2**20:.1f} | {row['rows']} | {seconds * 1000:.3f} "
              f"| {nbytes / seconds / 1e9:.1f} | {nbytes / seconds / bandwidth:.0%} "
              f"| {flops / 1e9:.0f} |")  # fmt: skip
    for fmt, label in VARIANTS.items():
        step = decode_step_reading(kernel_rows, fmt, args)
        if step is not None:
            print(
                f"{label}, one decoding step's linears (1 row of x, each timed alone): "
                f"{step / 1e9:.1f} GB/s of weights, {step / bandwidth:.0%} of the bandwidth"
            )


def decode_step_reading(
    rows: list[dict[str, Any]], fmt: str, args: argparse.Namespace
) -> float | None:
    """Bytes/s over one decoding step's linears: each shape's time alone (1 row of x), as many
    times as a step calls it (q and o, k and v, gate and up twice a layer; down once; the head
    once)."""
    calls = {"q, o": 2, "k, v": 2, "gate, up": 2, "down": 1}
    layers = shape_from_args(args)["num_layers"]
    nbytes = seconds = 0.0
    for row in rows:
        if row["format"] != fmt or row["rows"] != 1:
            continue
        count = 1 if row["name"] == "head" else calls[row["name"]] * layers
        nbytes += count * row["bytes"]
        seconds += count * row["seconds"]
    return nbytes / seconds if seconds else None


if __name__ == "__main__":
    main()
