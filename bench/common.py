"""What the benches against llama.cpp share: their worker processes, the model timing, llama-bench,
the memory bandwidth, a GGUF's stand-in vocabulary and the tables' cells."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

SEED = 0


# --------------------------------------------------------------------------- model workers


def engine_first() -> None:
    """Import the engine before MLX in a worker: it preloads the system OpenBLAS, which MLX
    binds to only if it is loaded before `mlx.core`."""
    import engine  # noqa: F401


def prompt_tokens(n: int, vocab_size: int, seed: int = SEED) -> Any:
    """`n` random token ids (llama-bench measures on random tokens too), shaped (1, n)."""
    import mlx.core as mx
    import numpy as np

    ids = np.random.default_rng(seed + n).integers(0, vocab_size, size=(1, n), dtype=np.int32)
    return mx.array(ids)


def next_logits(model: Any, tokens: Any, cache: list[Any] | None) -> Any:
    """The logits of the token after `tokens`: the whole forward pass over `tokens`, the head on
    the last position only (as llama.cpp and mlx-lm's generate compute it). A model without an
    `lm_head` ties it to its embedding."""
    hidden = model.model(tokens, cache=cache)[:, -1:, :]
    head = model.lm_head if "lm_head" in model else model.model.embed_tokens.as_linear
    return head(hidden)[0, -1]


def worker_model(
    kind: str, folder: str, prompts: list[int], decode_tokens: int, vocab_size: int
) -> dict[str, Any]:
    """Prefill tok/s of each prompt, each into a fresh KV cache, then decode tok/s of
    `decode_tokens` greedy steps of mlx-lm's generate_step after the first prompt, in one
    process. `kind` "mlx_lm" loads with `mlx_lm.load`, any other with the engine's loader."""
    if kind == "mlx_lm":
        import mlx.core as mx
        from mlx_lm import load

        model = load(folder)[0]
        kernels = "mlx (plain mlx-lm)"
    else:
        engine_first()
        import mlx.core as mx

        from engine import kernels as engine_kernels
        from engine.kernels import routing
        from engine.loading import load_model_sync

        model = load_model_sync(folder).model
        routing.install(model)  # harmless where the loader routed already
        kernels = engine_kernels.describe()
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache

    def greedy(tokens: Any, cache: list[Any]) -> Any:
        y = mx.argmax(next_logits(model, tokens, cache), axis=-1)
        mx.eval(y)
        return y

    # A warm-up step: the first call allocates MLX's buffers and the kernels' threads.
    greedy(prompt_tokens(1, vocab_size, seed=SEED + 1), make_prompt_cache(model))
    prefill_tps: dict[str, float] = {}
    decode_tps = 0.0
    for index, n in enumerate(prompts):
        cache = make_prompt_cache(model)
        started = time.perf_counter()
        y = greedy(prompt_tokens(n, vocab_size), cache)
        prefill_tps[str(n)] = n / (time.perf_counter() - started)
        if index == 0:
            # Decoding as the app decodes: mlx-lm's generate_step, which builds each step's
            # graph while the one before computes.
            steps = generate_step(
                y.reshape(-1), model, prompt_cache=cache, max_tokens=decode_tokens,
                sampler=lambda logits: mx.argmax(logits, axis=-1),
            )  # fmt: skip
            started = time.perf_counter()
            decoded = sum(1 for _ in steps)
            decode_tps = decoded / (time.perf_counter() - started)
    return {"prefill_tps": prefill_tps, "decode_tps": decode_tps, "kernels": kernels}


def worker_env(threads: int, kind: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(EXO_TUI_KERNEL_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    if kind == "mlx_lm":
        env["EXO_TUI_KERNELS"] = "mlx"
    return env


def run_worker(
    script: str,
    kind: str,
    payload: dict[str, Any],
    threads: int,
    *,
    check: bool = True,
    show_stderr: bool = False,
) -> dict[str, Any]:
    """Run `script --worker kind --payload JSON` in a fresh process; its last stdout line, as
    JSON. A failed worker exits the bench, or with `check=False` gives {"error": its tail}.
    `show_stderr` lets the worker's progress through to this terminal."""
    out = subprocess.run(
        [sys.executable, script, "--worker", kind, "--payload", json.dumps(payload)],
        stdout=subprocess.PIPE,
        stderr=None if show_stderr else subprocess.PIPE,
        text=True,
        env=worker_env(threads, kind),
    )
    if out.returncode != 0:
        if not check:
            lines = (out.stderr or out.stdout or "").strip().splitlines()
            return {"error": f"exit {out.returncode}: {lines[-1] if lines else ''}"}
        sys.stderr.write(out.stdout[-2000:] + (out.stderr or "")[-4000:])
        raise SystemExit(f"the {kind} worker failed (exit {out.returncode})")
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- llama.cpp


# llama.cpp's settings a bench tries, keeping the best that runs: its CPU repacking of the weights
# on (its default) and off, the weights mapped or read in.
LLAMA_SETTINGS = {
    "repack 1, -lm mmap": ["--repack", "1", "-lm", "mmap"],
    "repack 1, -lm none": ["--repack", "1", "-lm", "none"],
    "repack 0, -lm mmap": ["--repack", "0", "-lm", "mmap"],
    "repack 0, -lm none": ["--repack", "0", "-lm", "none"],
}


def best_of_settings(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One result of llama-bench's best figures over its settings' results, with the setting that
    gave each (`best_setting`, by figure) and the settings that failed (`failed`)."""
    best: dict[str, Any] = {"prefill_tps": {}, "decode_tps": None, "best_setting": {}}
    for setting, result in results.items():
        if "error" in result:
            best.setdefault("failed", {})[setting] = result["error"]
            continue
        best.setdefault("build", result.get("build"))
        for n, value in result.get("prefill_tps", {}).items():
            if value > best["prefill_tps"].get(n, 0.0):
                best["prefill_tps"][n] = value
                best["best_setting"][f"prefill {n}"] = setting
        decode = result.get("decode_tps")
        if decode is not None and decode > (best["decode_tps"] or 0.0):
            best["decode_tps"] = decode
            best["best_setting"]["decode"] = setting
    if best["decode_tps"] is None and not best["prefill_tps"]:
        return {"error": "; ".join(f"{k}: {v}" for k, v in best.get("failed", {}).items())}
    return best


def llama_bench(
    bin_dir: Path,
    model: Path,
    threads: int,
    prompts: list[int],
    decode_tokens: int,
    rounds: int,
    options: list[str],
) -> dict[str, Any]:
    """llama-bench's averages with `options` on top; {"error": ...} where it fails."""
    command = [str(bin_dir / "llama-bench"), "-m", str(model), "-t", str(threads),
               "-p", ",".join(map(str, prompts)), "-n", str(decode_tokens),
               "-r", str(rounds), *options, "-o", "json"]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0:
        tail = "\n".join(out.stderr.strip().splitlines()[-5:])
        return {"error": f"llama-bench exited with {out.returncode}: {tail}"}
    results = json.loads(out.stdout)
    prefill = {str(r["n_prompt"]): r["avg_ts"] for r in results if r["n_gen"] == 0}
    decode = [r["avg_ts"] for r in results if r["n_prompt"] == 0 and r["n_gen"] > 0]
    return {
        "prefill_tps": prefill,
        "decode_tps": decode[0] if decode else None,
        "build": f"{results[0].get('build_commit', '?')} on {results[0].get('cpu_info', '?')}",
    }


def add_stand_in_vocab(writer: Any, vocab_size: int) -> None:
    """llama-bench feeds random token ids, but llama.cpp loads a vocabulary of the embedding's
    size: a SentencePiece one of <unk> <s> </s>, the 256 byte tokens and filler pieces."""
    import gguf

    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256
    fillers = vocab_size - len(tokens)
    tokens += [f"\u2581t{i}" for i in range(fillers)]
    types += [gguf.TokenType.NORMAL] * fillers
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0, 0.0, 0.0, *([0.0] * 256), *(-float(i) for i in range(fillers))])
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)


# --------------------------------------------------------------------------- the machine


def read_bandwidth(threads: int, nbytes: int = 1 << 30, repeats: int = 5) -> dict[int, float]:
    """Bytes/s numpy reads summing an `nbytes` array, with 1 thread and with `threads` threads
    (each summing its share: numpy's sum is single-threaded and releases the GIL)."""
    import numpy as np

    data = np.ones(nbytes // 4, dtype=np.float32)  # written once, so every page is mapped
    out: dict[int, float] = {}
    for count in sorted({1, threads}):
        parts = np.array_split(data, count)
        with ThreadPoolExecutor(count) as pool:
            laps: list[float] = []
            for _ in range(repeats):
                started = time.perf_counter()
                list(pool.map(np.sum, parts))
                laps.append(time.perf_counter() - started)
        out[count] = nbytes / statistics.median(laps)
    return out


def last_level_cache_bytes() -> int | None:
    """The L3 (or largest) cache lscpu reports, in bytes."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    found = re.finditer(r"^L\d\w* cache:\s+([\d.]+)\s*([KMG])i?B", text, re.MULTILINE)
    sizes = [float(m[1]) * units[m[2]] for m in found]
    return int(max(sizes)) if sizes else None


# --------------------------------------------------------------------------- tables


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def figure(value: float | None) -> str:
    """A figure with one decimal, or two significant digits under 1 (a slow run's tok/s)."""
    if not value:
        return "-"
    return f"{value:.1f}" if value >= 1 else f"{value:.2g}"


def summary(result: dict[str, Any]) -> str:
    if "error" in result:
        return result["error"]
    prefill = ", ".join(f"{n}: {tps:.1f}" for n, tps in result["prefill_tps"].items())
    return f"prefill tok/s {prefill}; decode {figure(result['decode_tps'])} tok/s"


def median(runs: list[dict[str, Any]], key: str, n: int | None) -> float | None:
    """The median of a figure over runs (`key`, or its entry for `n` tokens), leaving out the
    runs that did not give it."""
    values: list[float] = []
    for run in runs:
        value = run.get(key)
        if isinstance(value, dict):
            value = value.get(str(n))  # pyright: ignore[reportUnknownMemberType]
        if isinstance(value, int | float) and value > 0:
            values.append(float(value))
    return statistics.median(values) if values else None
