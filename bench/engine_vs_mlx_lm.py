"""Benchmark: the exo-tui engine against plain mlx-lm on the same model, prompt and seed.

Each measurement runs in a fresh subprocess, engine and mlx-lm alternately, because the BLAS a
process uses is fixed when MLX is first imported: the anchor is plain `mlx_lm.load` +
`stream_generate` with the wheel's bundled BLAS; the engine preloads a system OpenBLAS when there
is one. Prints the median of each figure, the ratios, and TTFT on turn 10 against turn 1 of a
chat whose history grows every turn.

    .venv/bin/python bench/engine_vs_mlx_lm.py [--rounds 3] [--model PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# ~50M parameters: 10 layers, hidden 640, MLP 1792, untied embeddings.
BENCH_MODEL = dict(
    hidden_size=640,
    num_layers=10,
    num_heads=10,
    num_kv_heads=5,
    intermediate_size=1792,
    max_position_embeddings=8192,
)
MAX_TOKENS = 128
LOADS = 1
T = TypeVar("T")
SEED = 0


def shaped(hidden_size: int | None, num_layers: int | None) -> dict[str, int]:
    """The bench llama's shape with another width or depth (heads of 64 dimensions, the MLP
    2.8x as wide, as in the bench model)."""
    config = dict(BENCH_MODEL)
    if hidden_size is not None:
        heads = max(1, hidden_size // 64)
        config.update(
            hidden_size=hidden_size,
            num_heads=heads,
            num_kv_heads=max(1, heads // 2),
            intermediate_size=hidden_size * 14 // 5,
        )
    if num_layers is not None:
        config["num_layers"] = num_layers
    return config


def bench_model(config: dict[str, int] = BENCH_MODEL) -> Path:
    """The benchmark llama with `config`, built once into the user cache folder."""
    import platformdirs

    from tests.tiny_models import build_tiny_model

    key = "-".join(f"{k}{v}" for k, v in sorted(config.items()))
    folder = platformdirs.user_cache_path("exo-tui") / "bench" / f"llama-{key}"
    if not (folder / "config.json").exists():
        build_tiny_model(folder, "llama", **config)  # type: ignore[arg-type]
    return folder


def long_prompt() -> str:
    words = (
        "the cluster pools every machine a person owns so one model runs across them all "
        "with layers placed by memory and tokens streamed back live to the terminal"
    ).split()
    return " ".join(words[i % len(words)] for i in range(420)) + ". Summarise that."


def timed_load(load: Callable[[], T], times: int = LOADS) -> tuple[float, T]:
    """The fastest of `times` loads in this process. One by default: a user loads once, in a
    fresh process; later loads in one process measure the allocator's reuse, not loading."""
    best, result = float("inf"), None
    for _ in range(times):
        started = time.perf_counter()
        result = load()
        best = min(best, time.perf_counter() - started)
    assert result is not None
    return best, result


def worker_mlx_lm(model: str) -> dict[str, Any]:
    import mlx.core as mx
    from mlx_lm import load, stream_generate

    load_s, loaded = timed_load(lambda: load(model))
    llm, tokenizer = loaded[:2]  # load returns a union: the pair, or the pair and the config
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": long_prompt()}], add_generation_prompt=True
    )
    mx.random.seed(SEED)
    responses = list(stream_generate(llm, tokenizer, prompt, max_tokens=MAX_TOKENS))
    return {
        "load_s": load_s,
        "prefill_tps": responses[-1].prompt_tps,
        "decode_tps": responses[-1].generation_tps,
        "token_ids": [r.token for r in responses],
        "prompt_tokens": len(prompt),
    }


def load_mlx_lm(model: str) -> dict[str, Any]:
    from mlx_lm import load

    return {"load_s": timed_load(lambda: load(model))[0]}


def load_engine(model: str) -> dict[str, Any]:
    from engine.loading import load_model_sync

    return {"load_s": timed_load(lambda: load_model_sync(model))[0]}


def worker_engine(model: str) -> dict[str, Any]:
    from engine import blas
    from engine.generate import generate
    from engine.loading import load_model_sync
    from engine.types import ChatRequest, DoneChunk, Message

    load_s, loaded = timed_load(lambda: load_model_sync(model))
    request = ChatRequest(
        messages=(Message(role="user", content=long_prompt()),),
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        seed=SEED,
    )
    done = [c for c in generate(loaded, request) if isinstance(c, DoneChunk)][0]
    return {
        "load_s": load_s,
        "prefill_tps": done.stats.prefill_tps,
        "decode_tps": done.stats.decode_tps,
        "token_ids": list(done.token_ids),
        "prompt_tokens": done.usage.prompt_tokens,
        "blas": blas.describe(),
        **chat_ttfts(loaded),
    }


def worker_chats(model: str) -> dict[str, Any]:
    from engine import blas
    from engine.loading import load_model_sync

    return {"blas": blas.describe(), **chat_ttfts(load_model_sync(model))}


def chat_ttfts(loaded: Any) -> dict[str, Any]:
    """The ten-turn chats, keyed as `CHATS` names them."""
    return {
        "app_chat": ten_turn_ttfts(loaded, with_tools=True),
        "bare_chat": ten_turn_ttfts(loaded, with_tools=False),
        "typing_chat": ten_turn_ttfts(loaded, with_tools=False, pause=LAST_WORD),
        "app_typing_chat": ten_turn_ttfts(loaded, with_tools=True, pause=LAST_WORD),
        "paused_chat": ten_turn_ttfts(loaded, with_tools=False, pause=BEFORE_SENDING),
        "app_paused_chat": ten_turn_ttfts(loaded, with_tools=True, pause=BEFORE_SENDING),
    }


# Where the user's last pause in the typing came (the app prefills the message at each pause).
LAST_WORD = "before the last word"
BEFORE_SENDING = "before sending"


def ten_turn_ttfts(loaded: Any, *, with_tools: bool, pause: str | None = None) -> dict[str, Any]:
    """TTFT of each turn of a 10-turn chat whose history grows every turn.

    `with_tools` sends what the app sends every turn: a system message and the built-in tools.
    With a `pause`, the chat prefills what the app prefills while the user reads and types (not
    timed: the user is typing): the history after each answer, then the message as far as it
    was typed at the last pause, as if it were sent then.
    """
    from engine.generate import generate, prefill_next_turn
    from engine.types import ChatRequest, DoneChunk, Message
    from exo_tui.chat.tools import BUILTIN_TOOLS

    loaded.prompt_cache.clear()
    history: list[Message] = []
    if with_tools:
        history.append(Message(role="system", content="You are exo-tui's helpful assistant."))
    ttfts: list[float] = []
    new_tokens: list[int] = []
    done: DoneChunk | None = None
    for turn in range(10):
        message = f"Turn {turn}: " + long_prompt()[:160]
        if pause is not None:
            so_far = ChatRequest(messages=tuple(history), tools=BUILTIN_TOOLS if with_tools else ())
            typed = message[: message.rindex(" ")] if pause == LAST_WORD else message
            prefill_next_turn(loaded, so_far, draft=typed)
        history.append(Message(role="user", content=message))
        request = ChatRequest(
            messages=tuple(history),
            tools=BUILTIN_TOOLS if with_tools else (),
            max_tokens=32,
            temperature=0.0,
        )
        done = [c for c in generate(loaded, request) if isinstance(c, DoneChunk)][0]
        ttfts.append(done.stats.ttft_s)
        new_tokens.append(done.usage.prompt_tokens - done.usage.cached_tokens)
        answer = loaded.tokenizer.decode(list(done.token_ids))
        history.append(Message(role="assistant", content=answer))
        if pause is not None:
            prefill_next_turn(loaded, request.model_copy(update={"messages": tuple(history)}))
    assert done is not None
    return {"ttfts": ttfts, "new_tokens": new_tokens, "history_tokens": done.usage.prompt_tokens}


CHATS = (
    ("app_chat", "system + tools"),
    ("bare_chat", "no system, no tools"),
    ("typing_chat", "no system, no tools, last pause before the last word"),
    ("app_typing_chat", "system + tools as the app does, last pause before the last word"),
    ("paused_chat", "no system, no tools, last pause before sending"),
    ("app_paused_chat", "system + tools as the app does, last pause before sending"),
)


def print_chat_rows(runs: list[dict[str, Any]]) -> None:
    for key, label in CHATS:
        chats_run = [r[key] for r in runs if key in r]
        first = statistics.median(c["ttfts"][0] for c in chats_run)
        tenth = statistics.median(c["ttfts"][9] for c in chats_run)
        chat = chats_run[0]
        print(
            f"| TTFT turn 10 / turn 1, {label} ({chat['history_tokens']} tokens of history; "
            f"{chat['new_tokens'][0]} then {chat['new_tokens'][9]} tokens prefilled) "
            f"| | {tenth * 1000:.0f} ms / {first * 1000:.0f} ms | {tenth / first:.2f}x | ≤ 1.2x |"
        )


def run_worker(kind: str, model: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", kind, "--model", str(model)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument(
        "--loads", type=int, default=9, help="more fresh processes that only load, each way"
    )
    parser.add_argument(
        "--hidden-size", type=int, default=None, help="build the bench llama this wide instead"
    )
    parser.add_argument(
        "--num-layers", type=int, default=None, help="build the bench llama this deep instead"
    )
    parser.add_argument(
        "--chats-only",
        action="store_true",
        help="only the engine's ten-turn chats (TTFT turn 10 / turn 1), one process a round",
    )
    parser.add_argument(
        "--worker",
        choices=["engine", "mlx_lm", "load-engine", "load-mlx_lm", "chats"],
        default=None,
    )
    args = parser.parse_args()
    if args.worker:
        workers = {"engine": worker_engine, "mlx_lm": worker_mlx_lm, "chats": worker_chats,
                   "load-engine": load_engine, "load-mlx_lm": load_mlx_lm}  # fmt: skip
        print(json.dumps(workers[args.worker](str(args.model))))
        return

    model = args.model or bench_model(shaped(args.hidden_size, args.num_layers))
    from tests.tiny_models import parameter_count

    print(f"model: {model} ({parameter_count(model) / 1e6:.1f}M parameters)", flush=True)
    if args.chats_only:
        chat_runs = [run_worker("chats", model) for _ in range(args.rounds)]
        print(f"{args.rounds} rounds (medians); engine BLAS: {chat_runs[0]['blas']}")
        print("| figure | | engine | ratio | target |")
        print("|---|---|---|---|---|")
        print_chat_rows(chat_runs)
        return
    runs: dict[str, list[dict[str, Any]]] = {"engine": [], "mlx_lm": []}
    for round_ in range(args.rounds):
        for kind in ("mlx_lm", "engine"):
            result = run_worker(kind, model)
            runs[kind].append(result)
            print(
                f"round {round_ + 1} {kind:<7} load {result['load_s']:.2f} s  "
                f"prefill {result['prefill_tps']:.1f} tok/s  "
                f"decode {result['decode_tps']:.1f} tok/s",
                flush=True,
            )

    # A load takes ~0.1 s here, so one per round is noise: add processes that only load.
    for _ in range(args.loads):
        for kind in ("mlx_lm", "engine"):
            runs[kind].append(run_worker(f"load-{kind}", model))

    def median(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[kind] if key in r)

    engine, anchor = runs["engine"], runs["mlx_lm"]
    identical = all(
        e["token_ids"] == a["token_ids"]
        for e in engine if "token_ids" in e for a in anchor if "token_ids" in a
    )  # fmt: skip
    print()
    print(
        f"prompt {anchor[0]['prompt_tokens']} tokens, {MAX_TOKENS} generated, "
        f"{args.rounds} rounds (medians); engine BLAS: {engine[0]['blas']}"
    )
    print("| figure | mlx-lm (anchor) | engine | ratio | target |")
    print("|---|---|---|---|---|")
    rows = [
        ("prefill tok/s", "prefill_tps", "≥ 5x", False),
        ("decode tok/s", "decode_tps", "≥ 1.3x", False),
        (f"load s ({args.rounds + args.loads} fresh processes each)", "load_s", "≤ 1.1x", True),
    ]
    for label, key, target, _lower_better in rows:
        a, e = median("mlx_lm", key), median("engine", key)
        print(f"| {label} | {a:.2f} | {e:.2f} | {e / a:.2f}x | {target} |")
    print(f"| token ids identical | | | {'yes' if identical else 'NO'} | yes |")
    print_chat_rows(engine)


if __name__ == "__main__":
    main()
