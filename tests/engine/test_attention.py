"""The CPU attention computes what MLX's fused attention computes, and is what models use."""

from __future__ import annotations

import sys
from pathlib import Path

import mlx.core as mx
import pytest
from threadpoolctl import ThreadpoolController

from engine import attention, kernels
from engine.generate import generate
from engine.loading import load_model_sync
from engine.types import ChatRequest, DoneChunk, Message


def random_qkv(
    length: int, keys: int, heads: int = 8, kv_heads: int = 2, dtype: mx.Dtype = mx.float32
) -> tuple[mx.array, mx.array, mx.array]:
    mx.random.seed(length * 1000 + keys)
    q = mx.random.normal((1, heads, length, 32)).astype(dtype)
    k = mx.random.normal((1, kv_heads, keys, 32)).astype(dtype)
    v = mx.random.normal((1, kv_heads, keys, 32)).astype(dtype)
    return q, k, v


def max_difference(a: mx.array, b: mx.array) -> float:
    return float(mx.max(mx.abs(a.astype(mx.float32) - b.astype(mx.float32))))


@pytest.mark.parametrize(
    ("length", "keys", "mask"),
    [(40, 40, "causal"), (24, 300, "causal"), (1, 50, None), (30, 30, None)],
)
def test_matches_mlx_fused_attention(length: int, keys: int, mask: str | None) -> None:
    q, k, v = random_qkv(length, keys)
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask=mask)
    got = attention.attention(q, k, v, scale=0.2, mask=mask)
    assert got.shape == expected.shape
    assert max_difference(got, expected) < 1e-5


@pytest.mark.parametrize(
    ("length", "keys", "mask"),
    [(40, 40, "causal"), (24, 300, "causal"), (30, 30, None), (20, 30, "window")],
)
def test_sinks_match_mlx_fused_attention(length: int, keys: int, mask: str | None) -> None:
    """gpt-oss's sinks (a logit a head in each softmax), over a causal mask, none, or a sliding
    window's boolean mask; and a sink far above every score takes all the weight (outputs 0)."""
    q, k, v = random_qkv(length, keys)
    sinks = 2 * mx.random.normal((8,), key=mx.random.key(length))
    chosen: mx.array | str | None = mask
    if mask == "window":  # each query sees the 8 keys up to its own
        rows, cols = mx.arange(length)[:, None] + keys - length, mx.arange(keys)[None]
        chosen = (cols <= rows) & (cols > rows - 8)
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask=chosen, sinks=sinks)
    got = attention.attention(q, k, v, scale=0.2, mask=chosen, sinks=sinks)
    assert max_difference(got, expected) < 1e-5
    drowned = attention.attention(q, k, v, scale=0.2, mask=chosen, sinks=mx.full((8,), 1e4))
    assert float(mx.max(mx.abs(drowned))) < 1e-6


@pytest.mark.parametrize("shape", [(1, 1, 20, 30), (1, 8, 20, 30), (20, 30)])
def test_boolean_and_additive_masks(shape: tuple[int, ...]) -> None:
    q, k, v = random_qkv(20, 30)
    allowed = mx.random.uniform(shape=shape) > 0.3
    additive = mx.random.normal(shape)
    for mask in (allowed, additive):
        expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask=mask)
        assert max_difference(attention.attention(q, k, v, scale=0.2, mask=mask), expected) < 1e-5


def test_long_prompts_run_in_blocks_of_queries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attention, "MAX_SCORES", 2_000)  # 8 heads x 60 keys: 4 queries a block
    q, k, v = random_qkv(45, 60)
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask="causal")
    assert max_difference(attention.attention(q, k, v, scale=0.2, mask="causal"), expected) < 1e-5


@pytest.mark.parametrize("mask", ["causal", "boolean", None])
def test_shared_among_cores_it_computes_the_same(
    monkeypatch: pytest.MonkeyPatch, mask: str | None
) -> None:
    monkeypatch.setattr(attention, "PARALLEL_SCORES", 0)  # every block is shared
    monkeypatch.setattr(attention, "_cores", lambda: 3)
    q, k, v = random_qkv(37, 300)
    chosen = mx.random.uniform(shape=(37, 300)) > 0.3 if mask == "boolean" else mask
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask=chosen)
    got = attention.attention(q, k, v, scale=0.2, mask=chosen)
    assert max_difference(got, expected) < 1e-5


def test_large_blocks_are_shared_among_the_cores_and_small_ones_are_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(attention, "_cores", lambda: 2)
    big, small = attention.PARALLEL_SCORES, attention.PARALLEL_SCORES - 1
    assert attention._shares(96, big) == [slice(0, 48), slice(48, 96)]
    assert attention._shares(96, small) == [slice(0, 96)]
    assert attention._shares(1, big) == [slice(0, 1)]  # one query: nothing to share


def test_half_precision_keeps_its_dtype() -> None:
    q, k, v = random_qkv(33, 33, dtype=mx.bfloat16)
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask="causal")
    got = attention.attention(q, k, v, scale=0.2, mask="causal")
    assert got.dtype == mx.bfloat16
    assert max_difference(got, expected) < 2e-2


def test_loaded_models_route_prefill_through_it(tiny_llama: Path) -> None:
    loaded = load_model_sync(tiny_llama)
    module = sys.modules[type(loaded.model).__module__]
    routed = module.scaled_dot_product_attention
    assert hasattr(routed, "_exo_tui_original_sdpa")

    # A model's first prompt is measured in a small step first (engine/prefill.py); once its
    # pace is known, a prompt this short goes through in one pass.
    warm_up = ChatRequest(messages=(Message(role="user", content="hi"),), max_tokens=1)
    list(generate(loaded, warm_up))
    loaded.prompt_cache.clear()
    calls: list[int] = []
    original_attention = attention.attention

    def counting(q: mx.array, *args: object, **kwargs: object) -> mx.array:
        calls.append(q.shape[2])
        return original_attention(q, *args, **kwargs)  # type: ignore[arg-type]

    attention.attention = counting  # type: ignore[assignment]
    try:
        request = ChatRequest(
            # Long enough for a block of at least MIN_SCORES_PER_HEAD scores (L x L causal).
            messages=(Message(role="user", content="hello there, how are you today? " * 3),),
            max_tokens=4,
            temperature=0.0,
        )
        done = [c for c in generate(loaded, request) if isinstance(c, DoneChunk)][0]
    finally:
        attention.attention = original_attention
    # Prefill (the whole prompt, in the pass that gives the first token) goes through it once
    # per layer; decoding over a short history (one query a step) keeps MLX's kernel.
    assert calls and all(n == done.usage.prompt_tokens for n in calls)
    assert len(calls) == loaded.card.num_layers
    assert done.usage.prompt_tokens**2 >= attention.MIN_SCORES_PER_HEAD


def test_a_few_new_tokens_over_a_long_history_go_through_it_and_small_blocks_do_not(
    tiny_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = load_model_sync(tiny_llama)
    module = sys.modules[type(loaded.model).__module__]
    routed = module.scaled_dot_product_attention
    calls: list[tuple[str, int, int]] = []
    original_attention = attention.attention
    original_kernel = kernels.decode_attention

    def counting(q: mx.array, k: mx.array, *args: object, **kwargs: object) -> mx.array:
        calls.append(("numpy", q.shape[2], k.shape[2]))
        return original_attention(q, k, *args, **kwargs)  # type: ignore[arg-type]

    def counting_kernel(q: mx.array, k: mx.array, *args: object) -> mx.array:
        calls.append(("kernel", q.shape[2], k.shape[2]))
        return original_kernel(q, k, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(attention, "attention", counting)
    monkeypatch.setattr(kernels, "decode_attention", counting_kernel)
    for length, keys in [(4, 600), (2, 600), (8, 64), (1, 600), (1, 1100), (1, 2100)]:
        q, k, v = random_qkv(length, keys)
        routed(q, k, v, cache=None, scale=0.2, mask="causal" if length > 1 else None)
    # A draft's last words over a long chat: numpy. Small blocks (fewer than
    # MIN_SCORES_PER_HEAD scores per head): MLX's kernel. One query (decoding): the kernel
    # extension's attention where it is built; else MLX's kernel over fewer than
    # ONE_QUERY_MLX_KEYS keys and numpy past them.
    if kernels.available():
        one_query = [("kernel", 1, 600), ("kernel", 1, 1100), ("kernel", 1, 2100)]
    else:
        one_query = [("numpy", 1, 2100)]
    assert calls == [("numpy", 4, 600), ("numpy", 2, 600), *one_query]


def test_greedy_tokens_match_mlx_attention(
    tiny_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = ChatRequest(
        messages=(Message(role="user", content="tell me about the cluster and its nodes " * 8),),
        max_tokens=40,
        temperature=0.0,
    )
    loaded = load_model_sync(tiny_llama)
    ours = [c for c in generate(loaded, request) if isinstance(c, DoneChunk)][0].token_ids
    monkeypatch.setenv("EXO_TUI_ATTENTION", "mlx")
    assert not attention.enabled()
    loaded.prompt_cache.clear()
    theirs = [c for c in generate(loaded, request) if isinstance(c, DoneChunk)][0].token_ids
    assert ours == theirs


def test_numpys_own_blas_runs_on_the_calling_thread() -> None:
    # Its idle threads took the cores from MLX's BLAS between these small matmuls (6x slower).
    q, k, v = random_qkv(4, 600)
    attention.attention(q, k, v, scale=0.2, mask="causal")
    numpy_blas = ThreadpoolController().select(prefix="libscipy_openblas").lib_controllers
    assert numpy_blas and all(lib.num_threads == 1 for lib in numpy_blas)


def test_a_batchs_left_padded_mask_gives_mlxs_attention() -> None:
    """A batch of prompts with histories of different lengths: mlx-lm's BatchKVCache masks
    each row's padding with a boolean array of its own, which this path reads per row."""
    from mlx_lm.models.cache import BatchKVCache

    padding = [3, 0, 5]
    cache = BatchKVCache(padding)
    mx.random.seed(7)
    history = mx.random.normal((3, 2, 40, 32))
    cache.update_and_fetch(history, history)
    mask = cache.make_mask(20)
    assert isinstance(mask, mx.array) and mask.shape[0] == 3
    q = mx.random.normal((3, 8, 20, 32))
    k = mx.random.normal((3, 2, 60, 32))
    v = mx.random.normal((3, 2, 60, 32))
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask=mask)
    assert max_difference(attention.attention(q, k, v, scale=0.2, mask=mask), expected) < 1e-5
